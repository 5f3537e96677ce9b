"""What a claim locks while it is prepared or unprepared: one key per physical device.

Why a module: the per-device lock (``driver.claims.lock``) is only as sound
as its keys. Two claims that could touch the same hardware must share a key,
so a device's key is the physical device it lives on: a GPU's UUID for the
full GPU, its shares and its MIG placements (``Device.parent``), the device's
own identity for everything else (VFs, NVMe, CXL memory, fabric devices).
Each claim also locks its own UID, so two calls for one claim take turns.
A device this node does not know (gone from the inventory, a record a newer
build wrote) gives no keys (``None``): the claim then takes the lock whole,
which is always sound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.checkpoint import Checkpoint, ClaimRecord, ClaimState
from driver.claims.allocation import Allocation, parse_allocation
from driver.devices.handler import Inventory
from driver.devices.model import Device

CLAIM_PREFIX = "claim:"  # a claim's own key; device keys are UUIDs and PCI addresses


def device_key(device: Device) -> str:
    """The physical device ``device`` is, or is carved from."""
    return device.parent or device.local_id


def allocation_keys(uid: str, allocation: Allocation, inventory: Inventory) -> set[str] | None:
    """The keys of a claim about to be prepared, None if a device is unknown."""
    keys = {CLAIM_PREFIX + uid}
    for result in allocation.devices:
        device = inventory.lookup(result.pool, result.device)
        if device is None and result.prepared_as:  # a count manager's slot: what arrived
            device = inventory.lookup(result.pool, result.prepared_as)
        if device is None:
            return None
        keys.add(device_key(device))
    return keys


def record_keys(record: ClaimRecord, inventory: Inventory) -> set[str] | None:
    """The keys of a recorded claim (to undo it), None if a device is unknown
    or no longer the one recorded."""
    keys = {CLAIM_PREFIX + record.uid}
    for recorded in record.devices:
        device = inventory.lookup(recorded.pool_name, recorded.device_name)
        if device is None or device.local_id != recorded.local_id:
            return None
        keys.add(device_key(device))
    return keys


def prepare_keys(
    checkpoint: Checkpoint,
    inventory: Inventory,
    uid: str,
    claim: Mapping[str, Any] | BaseException | None,
) -> tuple[set[str] | None, Allocation | None]:
    """The keys preparing claim ``uid`` needs as things stand (None: the lock
    whole), and its allocation when that was read for them (the preparer
    uses it, so it is parsed once)."""
    record = checkpoint.claims.get(uid)
    if record is not None and record.state is ClaimState.PREPARE_COMPLETED:
        return {CLAIM_PREFIX + uid}, None
    if not isinstance(claim, Mapping):
        return None, None  # failed or unread: rare, and the claim's error comes under it
    allocation = parse_allocation(claim, uid, inventory.pools())
    keys = allocation_keys(uid, allocation, inventory)
    if keys is not None and record is not None:  # an interrupted prepare to undo first
        stale = record_keys(record, inventory)
        keys = None if stale is None else keys | stale
    return keys, allocation


def undo_keys(checkpoint: Checkpoint, inventory: Inventory, uid: str) -> set[str] | None:
    """The keys unpreparing claim ``uid`` needs as things stand."""
    record = checkpoint.claims.get(uid)
    return {CLAIM_PREFIX + uid} if record is None else record_keys(record, inventory)


@dataclass(frozen=True)
class Seen:
    """A claim's record as its keys were read from it (held: not reused)."""

    uid: str
    record: ClaimRecord | None
    state: object

    @classmethod
    def of(cls, checkpoint: Checkpoint, uid: str) -> Seen:
        record = checkpoint.claims.get(uid)
        return cls(uid, record, record.state if record is not None else None)

    def still(self, checkpoint: Checkpoint) -> bool:
        """Whether the record is unchanged now that the keys are held; if
        another call changed it meanwhile, its keys may be others."""
        now = checkpoint.claims.get(self.uid)
        return now is self.record and (now is None or now.state is self.state)
