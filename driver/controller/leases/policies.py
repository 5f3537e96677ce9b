"""Which DeviceLeasePolicies govern a claim, and the terms they set together.

Why: the lease clock needs, per claim, the duration it gets when it names
none, the warning time, the eviction grace period and (for extensions) how
much more it may have. The apiserver already applies each policy at
admission (the chart's ``leases.yaml``: the strictest wins, field by field,
because each must be met); this module reads the same policies the same way
for the controller: a policy governs a claim when its ``namespaceSelector``
selects the claim's namespace and one of its ``deviceClassNames`` is one the
claim asks for. Several that govern one claim combine into one
:class:`Terms`, each field the strictest, except two: each policy's idle
rule applies on its own (an Event from one, a reclaim from another), and
expiry only reports (audit) when every governing policy is in audit mode.
Pure: the keeper holds the caches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.errors import ConfigError
from driver.leaseterms import device_classes, format_duration, parse_duration

log = logging.getLogger(__name__)

POLICIES_PATH = "/apis/patchbay.dev/v1alpha1/deviceleasepolicies"


NONE, EVENT, RECLAIM = "None", "Event", "Reclaim"  # spec.idle.action


@dataclass(frozen=True)
class IdleRule:
    """One policy's ``spec.idle``: below ``threshold`` percent for ``length``
    seconds is idle, and ``action`` follows (``audit``: its policy only reports)."""

    policy: str
    threshold: float
    length: float
    action: str
    audit: bool = False


@dataclass(frozen=True)
class Policy:
    name: str
    selector: Mapping[str, Any]
    classes: frozenset[str]
    default: float | None
    maximum: float | None
    max_extension: float | None
    max_extension_total: float | None
    holder_may_extend: bool
    extend_groups: frozenset[str]
    warning: float | None
    grace: int | None
    idle: IdleRule | None = None
    audit: bool = False


@dataclass(frozen=True)
class Terms:
    """What the policies governing one claim allow, each field the strictest of them."""

    policies: tuple[str, ...] = ()
    default: float | None = None
    maximum: float | None = None
    warning: float | None = None
    grace: int | None = None
    max_extension: float | None = None  # None: no extension
    max_extension_total: float | None = None  # None: no cap beyond each extension's
    holder_may_extend: bool = True
    extend_groups: frozenset[str] = frozenset()
    idle: tuple[IdleRule, ...] = ()  # each governing policy's, each applied on its own
    audit: bool = False  # every governing policy only reports: expiry evicts nothing

    def duration(self, asked: str) -> float | None:
        """The lease's length: what the claim asked (its annotation), else the
        default, else the maximum, never above the maximum; None: no lease
        (nothing expires)."""
        length = self.default if self.default is not None else self.maximum
        if asked:
            try:
                length = parse_duration(asked)
            except ConfigError:
                log.warning("lease duration %r does not parse: the policy's default applies", asked)
        if length is not None and self.maximum is not None:
            length = min(length, self.maximum)  # several policies, or one made since admission
        return length


def _seconds(spec: Mapping[str, Any], field: str, policy: str) -> float | None:
    value = spec.get(field)
    return (
        parse_duration(str(value), f"DeviceLeasePolicy {policy}: spec.{field}") if value else None
    )


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """A stored DeviceLeasePolicy (the CRD has checked it; a ConfigError names a field if not)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    total = _seconds(spec, "maxExtensionTotal", name)
    grace = spec.get("evictionGracePeriodSeconds")
    audit = bool(spec.get("audit", False))
    return Policy(
        name=name,
        selector=spec.get("namespaceSelector") or {},
        classes=frozenset(str(c) for c in spec.get("deviceClassNames") or ()),
        default=_seconds(spec, "defaultDuration", name),
        maximum=_seconds(spec, "maxDuration", name),
        max_extension=_seconds(spec, "maxExtension", name),
        max_extension_total=total if total is not None else _seconds(spec, "maxDuration", name),
        holder_may_extend=bool(spec.get("holderMayExtend", True)),
        extend_groups=frozenset(str(g) for g in spec.get("extendGroups") or ()),
        warning=_seconds(spec, "warningBefore", name),
        grace=int(grace) if isinstance(grace, int) else None,
        idle=_idle_rule(spec.get("idle"), name, audit),
        audit=audit,
    )


def _idle_rule(idle: Any, policy: str, audit: bool) -> IdleRule | None:
    if not isinstance(idle, Mapping):
        return None
    where = f"DeviceLeasePolicy {policy}: spec.idle"
    try:
        threshold = float(idle["utilizationBelowPercent"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}.utilizationBelowPercent: a percent is required") from None
    length = parse_duration(str(idle.get("for") or ""), f"{where}.for")
    action = str(idle.get("action") or EVENT)
    if action not in (NONE, EVENT, RECLAIM):
        raise ConfigError(f"{where}.action: {action!r} is not one of None, Event, Reclaim")
    return IdleRule(policy, threshold, length, action, audit)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector's verdict on ``labels`` (absent or empty: everything)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or ()
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
    return True


def _least(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def terms_for(
    claim: Mapping[str, Any], policies: Iterable[Policy], ns_labels: Mapping[str, str]
) -> Terms:
    """The combined terms of the policies that govern ``claim`` (no policy: no terms)."""
    classes = device_classes(claim)
    chosen = sorted(
        (p for p in policies if p.classes & classes and selects(p.selector, ns_labels)),
        key=lambda p: p.name,
    )
    if not chosen:
        return Terms()
    warnings = [p.warning for p in chosen if p.warning is not None]
    graces = [p.grace for p in chosen if p.grace is not None]
    extendable = all(p.max_extension is not None for p in chosen)
    return Terms(
        policies=tuple(p.name for p in chosen),
        default=_least(p.default for p in chosen),
        maximum=_least(p.maximum for p in chosen),
        warning=max(warnings) if warnings else None,
        grace=min(graces) if graces else None,
        max_extension=_least(p.max_extension for p in chosen) if extendable else None,
        max_extension_total=_least(p.max_extension_total for p in chosen),
        holder_may_extend=all(p.holder_may_extend for p in chosen),
        extend_groups=frozenset.intersection(*(p.extend_groups for p in chosen)),
        idle=tuple(p.idle for p in chosen if p.idle is not None),
        audit=all(p.audit for p in chosen),
    )


def extension_refusal(by: str, extended: float, terms: Terms) -> str:
    """Why an extension by ``by`` after ``extended`` seconds is refused ("" if it is not)."""
    try:
        seconds = parse_duration(by, "lease-extend-by")
    except ConfigError as exc:
        return str(exc)
    if terms.max_extension is None:
        return "no DeviceLeasePolicy that governs the claim allows extensions (spec.maxExtension)"
    if seconds > terms.max_extension:
        return f"longer than spec.maxExtension {format_duration(terms.max_extension)}"
    cap = terms.max_extension_total
    if cap is not None and extended + seconds > cap:
        return f"{format_duration(extended + seconds)} in all passes the cap {format_duration(cap)}"
    return ""
