"""Idle devices under a policy: what a claim the node reports idle is due.

Why: the node plugin marks a device ``Idle`` once it has stayed below the
node's threshold (``kubeletPlugin.idleThreshold``) for the node's window,
and says since when (``driver.idleterms``); a DeviceLeasePolicy's
``spec.idle`` says how long a claim may stay idle and what follows. A
claim is idle when every device of ours it holds is reported idle, since
the latest of their stretches began. A policy's rule is due ``for`` after
that, and only if the node's threshold is at or below the rule's
``utilizationBelowPercent``: a device below 5 % is below 10 % too, but a
device below 5 % may not be below 3 %, so a rule stricter than the node
can tell never fires (the keeper says so on the policy, docs/leases.md).

What is due, strongest first: ``Reclaim`` (a rule of an enforcing policy),
``WouldReclaim`` (a reclaim rule of a policy in audit mode: only reported)
and ``Event``. The last two are reported once per idle stretch: the claim
records which (``patchbay.dev/lease-idle-noted``) before the Event, so a
restart reports nothing twice. A device that turns busy ends the stretch;
the next one is a new one. Pure: the keeper acts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.controller.leases.policies import EVENT, NONE, RECLAIM, IdleRule
from driver.idleterms import IdleReport, idle_reports
from driver.leaseterms import Lease, stamp

WOULD_RECLAIM = "WouldReclaim"


@dataclass(frozen=True)
class IdleState:
    """A claim all of whose devices are reported idle."""

    reports: tuple[IdleReport, ...]
    since: float  # wall seconds: when the last of its devices went low
    threshold: float | None  # the node's (the highest its devices' reports name)

    def devices(self) -> str:
        return ", ".join(r.device for r in self.reports)


@dataclass(frozen=True)
class IdleDue:
    action: str  # RECLAIM, WOULD_RECLAIM or EVENT
    rules: tuple[IdleRule, ...]  # the due rules that ask for it
    state: IdleState

    @property
    def noted(self) -> str:
        return noted(self.state.since, self.action)


def noted(since: float, action: str) -> str:
    """The value of ``lease-idle-noted`` once ``action`` was reported for the
    stretch that began at ``since``."""
    return f"{stamp(since)} {action}"


def idle_state(claim: Mapping[str, Any]) -> IdleState | None:
    reports = idle_reports(claim)
    if reports is None:
        return None
    known = [r.threshold for r in reports if r.threshold is not None]
    unknown = len(known) < len(reports)
    return IdleState(
        tuple(reports),
        max(r.since for r in reports),
        None if unknown else max(known),
    )


def provable(rule: IdleRule, state: IdleState) -> bool:
    """Whether the node's reports show the rule's idleness (its threshold at
    or below the rule's)."""
    return state.threshold is not None and state.threshold <= rule.threshold


def unprovable(
    claim: Mapping[str, Any], rules: Iterable[IdleRule]
) -> tuple[float | None, list[IdleRule]]:
    """The node's threshold on an idle ``claim``, and the acting rules its
    reports cannot satisfy (none when the claim is not idle)."""
    state = idle_state(claim)
    if state is None:
        return None, []
    return state.threshold, [r for r in rules if r.action != NONE and not provable(r, state)]


def idle_due(
    claim: Mapping[str, Any], lease: Lease, rules: Iterable[IdleRule], now: float
) -> tuple[IdleDue | None, float | None]:
    """What idleness asks of ``claim`` at wall time ``now`` (None: nothing), and
    when the next rule falls due (None: none waits)."""
    state = idle_state(claim)
    if state is None:
        return None, None
    ripe: dict[str, list[IdleRule]] = {}
    waits = []
    for rule in rules:
        if rule.action == NONE or not provable(rule, state):
            continue
        at = state.since + rule.length
        if now < at:
            waits.append(at)
            continue
        action = WOULD_RECLAIM if rule.action == RECLAIM and rule.audit else rule.action
        ripe.setdefault(action, []).append(rule)
    nxt = min(waits, default=None)
    for action in (RECLAIM, WOULD_RECLAIM, EVENT):
        if action not in ripe:
            continue
        step = IdleDue(action, tuple(ripe[action]), state)
        if action != RECLAIM and lease.idle_noted == step.noted:
            return None, nxt  # reported for this stretch already
        return step, nxt
    return None, nxt
