"""A claim's lease as it is written on the claim: names, durations, stamps.

Why: the lease's state must survive a controller restart and a leader
change, so it lives on the claim itself, in annotations only patchbay may
write (the chart's ``lease-state.yaml`` guards them; its CEL lists the same
names, docs/leases.md). This module is the one place patchbay reads and
writes them (the controller's lease keeper, ``kubectl patchbay leases``):
what the user asked (reason, duration), who holds the claim, when the
lease started and ends, how much it was extended and how far it has gone
(warned, expired, reclaimed while idle) and which idle stretch was last
reported. Pure functions; no clock of its own.
Durations are Go's (``90m``, ``1h30m``, ``2.5h``), as the policy's CRD and
the apiserver's CEL ``duration()`` read them; stamps are RFC 3339 UTC.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.errors import ConfigError

PREFIX = "patchbay.dev/lease-"
REASON = PREFIX + "reason"  # the user's, checked at admission by the lease policy
DURATION = PREFIX + "duration"
HOLDER = PREFIX + "holder"  # recorded at admission (lease-state.yaml), then patchbay's
HOLDER_POD = PREFIX + "holder-pod"  # a template claim's owner Pod, whose holder it takes
START = PREFIX + "start"  # patchbay's from here down
EXPIRY = PREFIX + "expiry"
EXTENDED = PREFIX + "extended"  # all extensions together, a duration
PHASE = PREFIX + "phase"  # WARNED, then EXPIRED (or AUDIT_EXPIRED); RECLAIMED when idle
IDLE_NOTED = PREFIX + "idle-noted"  # "<since> <action>": the idle stretch last reported
EXTENDED_ID = PREFIX + "extended-id"  # the last extension request applied (or refused)
EXTEND_REQUESTER = PREFIX + "extend-requester"  # recorded at admission (lease-state.yaml)
# An extension request, the user's (kubectl patchbay lease extend; judged at admission):
EXTEND_BY = PREFIX + "extend-by"
EXTEND_REASON = PREFIX + "extend-reason"
EXTEND_ID = PREFIX + "extend-id"  # new for each request
WARNED, EXPIRED, RECLAIMED = "Warned", "Expired", "Reclaimed"  # the last two evict
AUDIT_EXPIRED = "AuditExpired"  # ended under policies in audit mode: reported, nothing evicted
# A started lease's state by its phase (no phase: active), as the metrics and kubectl name it.
STATES = {WARNED: "expiring", EXPIRED: "expired", RECLAIMED: "reclaimed", AUDIT_EXPIRED: "audited"}

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds of a Go duration (``8h``, ``1h30m``, ``90s``); a ConfigError naming ``what``."""
    text = text.strip()
    if not text or _PART.sub("", text) != "":
        raise ConfigError(f"{what}: {text!r} is not a duration (e.g. 90m, 8h, 1h30m)")
    return sum(float(n) * _UNIT[u] for n, u in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """``seconds`` as a short Go duration: ``2h``, ``1h30m``, ``45s`` (whole seconds)."""
    total = max(0, round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "")
    return out or "0s"


def stamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def parse_stamp(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC stamp (fractions dropped); None if not one."""
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Lease:
    """What a claim's annotations say of its lease (empty strings and None where unset)."""

    namespace: str
    name: str
    uid: str
    holder: str
    holder_pod: str
    reason: str
    duration: str  # as the user asked; "" for the policy's default
    start: float | None
    expiry: float | None
    extended: float  # seconds all extensions added
    phase: str
    idle_noted: str = ""
    extend_by: str = ""
    extend_reason: str = ""
    extend_id: str = ""
    extend_requester: str = ""
    extended_id: str = ""

    @property
    def extension_asked(self) -> bool:
        """A request (a new extend-id) the controller has not applied or refused yet."""
        return bool(self.extend_id) and self.extend_id != self.extended_id

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def lease_of(claim: Mapping[str, Any]) -> Lease:
    meta = claim.get("metadata") or {}
    notes: Mapping[str, str] = meta.get("annotations") or {}
    try:
        extended = parse_duration(notes[EXTENDED]) if notes.get(EXTENDED) else 0.0
    except ConfigError:
        extended = 0.0
    return Lease(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        holder=notes.get(HOLDER, ""),
        holder_pod=notes.get(HOLDER_POD, ""),
        reason=notes.get(REASON, ""),
        duration=notes.get(DURATION, ""),
        start=parse_stamp(notes.get(START, "")),
        expiry=parse_stamp(notes.get(EXPIRY, "")),
        extended=extended,
        phase=notes.get(PHASE, ""),
        idle_noted=notes.get(IDLE_NOTED, ""),
        extend_by=notes.get(EXTEND_BY, ""),
        extend_reason=notes.get(EXTEND_REASON, ""),
        extend_id=notes.get(EXTEND_ID, ""),
        extend_requester=notes.get(EXTEND_REQUESTER, ""),
        extended_id=notes.get(EXTENDED_ID, ""),
    )


def allocated_at(claim: Mapping[str, Any]) -> tuple[bool, float | None]:
    """Whether ``claim`` is allocated, and its ``allocationTimestamp`` (None if unset)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return False, None
    return True, parse_stamp(str(allocation.get("allocationTimestamp") or ""))


def users(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(name, uid)`` of the pods ``status.reservedFor`` lists: those using the claim."""
    out = []
    for ref in (claim.get("status") or {}).get("reservedFor") or ():
        if ref.get("resource") == "pods" and not ref.get("apiGroup"):
            out.append((str(ref.get("name") or ""), str(ref.get("uid") or "")))
    return out


def owner_pod(claim: Mapping[str, Any]) -> str:
    """The name of the Pod that controls ``claim`` (a claim made from a template), or ""."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1" and ref.get("controller"):
            return str(ref.get("name") or "")
    return ""


def device_classes(claim: Mapping[str, Any]) -> set[str]:
    """The DeviceClasses the claim's requests name (directly or among firstAvailable)."""
    out: set[str] = set()
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        exactly = r.get("exactly") or {}
        if exactly.get("deviceClassName"):
            out.add(str(exactly["deviceClassName"]))
        for sub in r.get("firstAvailable") or ():
            if sub.get("deviceClassName"):
                out.add(str(sub["deviceClassName"]))
    return out
