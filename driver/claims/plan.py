"""Plan a claim's prepare: which local devices it gets, what others hold, what goes on record.

A prepare first decides, without touching hardware, what it will do: each
allocated device looked up in the node's inventory, refused when another
claim's record holds it (a share of a shareable device may join other
shares; an admin-access view holds nothing and joins anything), its opaque
configs decoded and merged, and the undo data its handler (and claim-wide
sharing) needs recorded. The preparer writes that plan to the checkpoint as
``PrepareStarted`` before any handler runs, so a crash at any later step
knows what to undo. Kept apart from :mod:`driver.claims.preparer`, which
orders the steps, saves and rolls back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from driver.checkpoint import ADMIN_ACCESS, SHARE_ID, Checkpoint, DeviceRecord
from driver.checkpoint import holdings as recorded
from driver.claims.allocation import Allocation
from driver.claims.model import ClaimRef
from driver.config import opaque
from driver.devices.handler import ClaimSharing, DeviceHandler, Inventory
from driver.devices.model import Device
from driver.errors import ClaimError

# One planned device: its checkpoint record, the inventory device (with the
# capacity a share consumed), and its effective opaque config.
Planned = tuple[DeviceRecord, Device, opaque.DeviceConfig | None]


@dataclass(frozen=True)
class Holdings:
    """What the checkpoint's other claims hold, by every key a device is known by."""

    held: dict[tuple[str, ...], str]  # key -> the holding claim's UID
    sharers: set[tuple[str, ...]]  # keys held only by shares of a shareable device

    def owner(self, keys: list[tuple[str, ...]], share_id: str | None) -> str | None:
        """The claim that keeps a device with these keys from this claim, if any."""
        owner = next((self.held[k] for k in keys if k in self.held), None)
        if owner is not None and share_id and self.sharers.issuperset(keys[:2]):
            return None  # one more share of a device only shares hold
        return owner


def holdings(checkpoint: Checkpoint, handlers: Mapping[str, DeviceHandler], uid: str) -> Holdings:
    """The devices every recorded claim but ``uid`` holds."""
    held: dict[tuple[str, ...], str] = {}
    sharers: set[tuple[str, ...]] = set()
    others: set[tuple[str, ...]] = set()
    for h in recorded(checkpoint, handlers):
        if h.claim_uid == uid:
            continue
        held[(h.kind, h.local_id)] = held[(h.local_id,)] = h.claim_uid
        shared = h.share_id is not None
        (sharers if shared else others).update({(h.kind, h.local_id), (h.local_id,)})
        if h.newer:  # a newer build's record holds its hardware whatever it calls it
            held[(h.local_id,)] = held[(h.pool, h.device)] = h.claim_uid
    return Holdings(held, sharers - others)


def plan_claim(
    ref: ClaimRef,
    allocation: Allocation,
    checkpoint: Checkpoint,
    inventory: Inventory,
    handlers: Mapping[str, DeviceHandler],
    sharing: ClaimSharing | None,
) -> list[Planned]:
    """The claim's devices as they will be recorded; ClaimError when one cannot be had."""
    taken = holdings(checkpoint, handlers, ref.uid)
    planned: list[Planned] = []
    for result in allocation.devices:
        device = inventory.lookup(result.pool, result.device)
        if device is None and result.prepared_as:  # a count manager's slot: what arrived
            arrived = inventory.lookup(result.pool, result.prepared_as)
            # Under the allocated name from here on (CDI device, metadata), as the kubelet knows it.
            device = replace(arrived, name=result.device) if arrived is not None else None
        if device is None:
            raise ClaimError(f"device {result.device} of pool {result.pool} is not on this node")
        if device.kind not in handlers:
            raise ClaimError(f"device {result.device}: no handler for type {device.kind}")
        keys = [(device.kind, device.local_id), (device.local_id,), (result.pool, result.device)]
        owner = None if result.admin_access else taken.owner(keys, result.share_id)
        if owner is not None:
            raise ClaimError(f"device {result.device} is already prepared for claim {owner}")
        if result.share_id is not None:  # the share as allocated: what it consumed
            device = replace(device, capacity=dict(result.consumed_capacity))
        configs = [
            opaque.decode(c.parameters, f"config[{c.index}] ({c.source})")
            for c in allocation.configs_for(result.request)
        ]
        config = opaque.effective(configs, device.kind, result.device)
        record = DeviceRecord(
            request_names=[result.request],
            pool_name=result.pool,
            device_name=result.device,
            kind=device.kind,
            local_id=device.local_id,
            undo=handlers[device.kind].plan_undo(device, config),
        )
        if result.share_id is not None:
            record.undo[SHARE_ID] = result.share_id
        if result.admin_access:  # a read-only view: no config (no sharing) applies
            record.undo, config = {ADMIN_ACCESS: True}, None
        planned.append((record, device, config))
    if sharing is not None:  # undo data on record before it happens
        extra = sharing.plan(ref.uid, [(d, c) for _, d, c in planned])
        for (record, _, _), undo in zip(planned, extra, strict=True):
            record.undo = {**record.undo, **undo}
    return planned
