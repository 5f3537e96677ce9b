"""The lease clock: what is due for one claim now, and when to look again.

Why: a lease starts when its claim is allocated and ends a fixed time
later, whatever happens to the controller in between, so its start and
expiry are written on the claim once (``driver.leaseterms``) and every
decision after is a pure function of the claim, its policies' terms and
the wall clock: stamp it, warn, expire it, evict again the pods an
expired (or reclaimed) lease still has, or act on idle devices
(``driver.controller.leases.idle``). A restarted controller or a new leader
reads the same stamps and reaches the same decision; a phase already
written (warned, expired, reclaimed) or an idle stretch already reported is
never announced again.

The stamp the lease starts from is the allocation's ``allocationTimestamp``
(the scheduler's clock) when it is set and no more than
:data:`LEASE_SKEW_S` ahead of the controller's clock; otherwise (unset, as
the API allows, or further ahead) the controller's own clock when it first
sees the claim allocated. A lease allocated while no controller ran still
counts from its allocation. The control plane's clocks are assumed to agree
within that skew (NTP); a scheduler clock behind the controller's shortens a
lease by as much. Wall-clock stamps are the one thing that can outlive a
process; the keeper waits for them with the event loop's monotonic clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.controller.leases.idle import IdleDue, idle_due
from driver.controller.leases.policies import RECLAIM, Terms
from driver.leaseterms import (
    AUDIT_EXPIRED,
    EXPIRED,
    RECLAIMED,
    WARNED,
    Lease,
    allocated_at,
    lease_of,
    owner_pod,
    users,
)

LEASE_SKEW_S = 30.0  # how far ahead of ours the scheduler's allocationTimestamp may be

STAMP, WARN, EXPIRE, EVICT, EXTEND = "stamp", "warn", "expire", "evict", "extend"
IDLE_RECLAIM, IDLE_REPORT = "reclaim", "idle"  # idle: take the devices back, or report it


@dataclass(frozen=True)
class Step:
    """What is due for one claim: ``kind`` is STAMP (start and expiry given),
    EXTEND (an extension asked), WARN, EXPIRE, EVICT (an expired or reclaimed
    lease's pods still run), IDLE_RECLAIM or IDLE_REPORT (``idle`` says why)."""

    kind: str
    lease: Lease
    start: float = 0.0
    expiry: float = 0.0
    idle: IdleDue | None = None


def lease_start(allocation_timestamp: float | None, now: float) -> float:
    """When a lease allocated at ``allocation_timestamp`` starts, seen at ``now``."""
    if allocation_timestamp is None or allocation_timestamp > now + LEASE_SKEW_S:
        return now
    return allocation_timestamp


def due(claim: Mapping[str, Any], terms: Terms, now: float) -> tuple[Step | None, float | None]:
    """The step due for ``claim`` at wall time ``now``, and the wall time at
    which the next one falls due (None: nothing to wait for). The lease's own
    steps come first (stamp, extend, expire), then an idle reclaim, then the
    warning, then an idle report."""
    lease = lease_of(claim)
    allocated, at = allocated_at(claim)
    deleting = bool((claim.get("metadata") or {}).get("deletionTimestamp"))
    if lease.phase in (EXPIRED, RECLAIMED):  # evicted until no pod uses it (a PDB may
        standalone = not owner_pod(claim)  # hold one back), and a standalone claim deleted
        taken = not users(claim) and (deleting or not standalone)
        return (None, None) if taken else (Step(EVICT, lease), None)
    if not allocated or deleting:
        return None, None
    step, wait = _lease_due(lease, at, terms, now)
    if step is not None and step.kind != WARN:
        return step, wait
    idle, idle_wait = idle_due(claim, lease, terms.idle, now)
    waits = [w for w in (wait, idle_wait) if w is not None]
    if idle is not None and (step is None or idle.action == RECLAIM):
        kind = IDLE_RECLAIM if idle.action == RECLAIM else IDLE_REPORT
        step = Step(kind, lease, idle=idle)
    return step, min(waits, default=None)


def _lease_due(
    lease: Lease, at: float | None, terms: Terms, now: float
) -> tuple[Step | None, float | None]:
    if lease.phase == AUDIT_EXPIRED:
        return None, None  # reported at its end; its pods keep the devices
    if lease.start is None:
        length = terms.duration(lease.duration)
        if length is None:
            return None, None  # no lease asked and no policy: nothing expires
        start = lease_start(at, now)
        return Step(STAMP, lease, start, start + length), None
    if lease.expiry is None:
        return None, None
    if lease.extension_asked:  # before expiry: one asked in time is applied first
        return Step(EXTEND, lease), None
    if now >= lease.expiry:
        return Step(EXPIRE, lease), None
    if terms.warning is not None and lease.phase != WARNED:
        warn_at = lease.expiry - terms.warning
        if now >= warn_at:
            return Step(WARN, lease), lease.expiry
        return None, warn_at
    return None, lease.expiry
