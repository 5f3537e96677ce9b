"""Which claim holds which device, read from the checkpoint's records.

Why a module: the claim planner (``driver.claims.plan``) and the MIG
start-up and guard (``driver.mig.startup``) both need what the recorded
claims hold, as typed values and read alike: a device as a share, a record
only a newer build understands (which holds its hardware whatever it calls
it), an admin-access view (which holds nothing). The records themselves
are ``driver.checkpoint``'s.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

from driver.checkpoint import Checkpoint, ClaimRecord, ClaimState


class Holding(NamedTuple):
    """One device a recorded claim holds (or is preparing, or must undo).
    A named tuple: the planner's index reads one per device of each record."""

    claim_uid: str
    kind: str
    local_id: str
    pool: str
    device: str
    share_id: str | None  # one share of a shareable device
    newer: bool  # the record has what only a newer build understands


def holdings(checkpoint: Checkpoint, kinds: Collection[str]) -> list[Holding]:
    """Every device the checkpoint's claims hold; admin-access views hold
    nothing. ``kinds``: the device kinds this build has handlers for."""
    out: list[Holding] = []
    for claim in list(checkpoint.claims.values()):  # a copy: claims' threads add and drop
        out += record_holdings(claim, kinds)
    return out


def record_holdings(claim: ClaimRecord, kinds: Collection[str]) -> list[Holding]:
    """The devices one claim's record holds (:func:`holdings`)."""
    # ClaimRecord.not_understood, without its message
    newer = not isinstance(claim.state, ClaimState) or any(
        d.kind not in kinds for d in claim.devices
    )
    return [
        Holding(claim.uid, d.kind, d.local_id, d.pool_name, d.device_name, d.share_id, newer)
        for d in claim.devices
        if not d.admin_access
    ]
