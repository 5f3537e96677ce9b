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

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import replace

from driver.checkpoint import ADMIN_ACCESS, SHARE_ID, Checkpoint, ClaimRecord, DeviceRecord
from driver.claims.allocation import Allocation
from driver.claims.model import ClaimRef
from driver.config import opaque
from driver.devices.handler import ClaimSharing, DeviceHandler, Inventory
from driver.devices.model import Device
from driver.errors import ClaimError
from driver.holdings import record_holdings

# One planned device: its checkpoint record, the inventory device (with the
# capacity a share consumed), and its effective opaque config.
Planned = tuple[DeviceRecord, Device, opaque.DeviceConfig | None]


class Holdings:
    """What the checkpoint's claims hold, by every key a device is known by,
    kept as records come and go (:meth:`add`, :meth:`remove`): a prepare
    looks up its own devices' keys instead of scanning every record, so its
    cost does not grow with the claims on the node, and the preparer's
    ``prepared_devices`` reads :meth:`devices`. :meth:`sync` rebuilds it
    when the checkpoint was replaced (read again from disk) or changed size
    behind its back."""

    def __init__(self, kinds: Collection[str]) -> None:
        self._kinds = kinds
        self._by_key: dict[tuple[str, ...], dict[str, bool]] = {}  # key -> {claim: a share?}
        self._keys: dict[str, list[tuple[str, ...]]] = {}  # claim -> its keys
        # (kind, local id) of every recorded device, admin views too -> how many
        # records name it; and each claim's (for prepared_devices, O(devices))
        self._devices: Counter[tuple[str, str]] = Counter()
        self._held: dict[str, list[tuple[str, str]]] = {}
        self._stamp: tuple[int, int] | None = None

    @classmethod
    def of(cls, checkpoint: Checkpoint, kinds: Collection[str]) -> Holdings:
        taken = cls(kinds)
        taken.sync(checkpoint)
        return taken

    def sync(self, checkpoint: Checkpoint) -> None:
        if self._stamp == (id(checkpoint), len(checkpoint.claims)):
            return
        self._by_key.clear()
        self._keys.clear()
        self._devices.clear()
        self._held.clear()
        for record in checkpoint.claims.values():
            self._index(record)
        self._stamp = (id(checkpoint), len(checkpoint.claims))

    def _index(self, record: ClaimRecord) -> None:
        keys: list[tuple[str, ...]] = []
        for h in record_holdings(record, self._kinds):
            shared = h.share_id is not None
            for key in ((h.kind, h.local_id), (h.local_id,)):
                self._by_key.setdefault(key, {})[h.claim_uid] = shared
                keys.append(key)
            if h.newer:  # a newer build's record holds its hardware whatever it calls it
                self._by_key.setdefault((h.pool, h.device), {})[h.claim_uid] = False
                keys.append((h.pool, h.device))
        self._keys[record.uid] = keys
        held = self._held[record.uid] = [(d.kind, d.local_id) for d in record.devices]
        self._devices.update(held)

    def add(self, checkpoint: Checkpoint, record: ClaimRecord) -> None:
        """``record`` was just put in ``checkpoint`` (a new claim's)."""
        self.sync_without(checkpoint, record.uid)
        self._index(record)
        self._stamp = (id(checkpoint), len(checkpoint.claims))

    def remove(self, checkpoint: Checkpoint, uid: str) -> None:
        """Claim ``uid``'s record was just dropped from ``checkpoint``."""
        for device in self._held.pop(uid, ()):
            if self._devices[device] > 1:
                self._devices[device] -= 1
            else:
                del self._devices[device]
        for key in self._keys.pop(uid, ()):
            holders = self._by_key.get(key, {})
            holders.pop(uid, None)
            if not holders:
                self._by_key.pop(key, None)
        self._stamp = (id(checkpoint), len(checkpoint.claims))

    def sync_without(self, checkpoint: Checkpoint, uid: str) -> None:
        """Up to date with ``checkpoint`` as it was before ``uid``'s record came."""
        if self._stamp != (id(checkpoint), len(checkpoint.claims) - 1):
            self._stamp = None
            self.sync(checkpoint)
            self.remove(checkpoint, uid)

    def devices(self) -> set[tuple[str, str]]:
        """(kind, local id) of every device a record names (admin-access views
        too: a container uses the device), without reading any record."""
        return set(self._devices)

    def owner(self, keys: list[tuple[str, ...]], share_id: str | None, uid: str) -> str | None:
        """The claim other than ``uid`` that keeps a device with these keys
        from ``uid``, if any: one more share of a device that only shares
        hold may join them."""
        owner = next((u for k in keys for u in self._by_key.get(k, {}) if u != uid), None)
        if owner is not None and share_id:
            only_shares = all(
                any(u != uid for u in self._by_key.get(k, {}))
                and all(s for u, s in self._by_key.get(k, {}).items() if u != uid)
                for k in keys[:2]
            )
            if only_shares:
                return None
        return owner


def plan_claim(
    ref: ClaimRef,
    allocation: Allocation,
    checkpoint: Checkpoint,
    inventory: Inventory,
    handlers: Mapping[str, DeviceHandler],
    sharing: ClaimSharing | None,
    taken: Holdings | None = None,
) -> list[Planned]:
    """The claim's devices as they will be recorded; ClaimError when one cannot
    be had. ``taken``: the preparer's index of what the checkpoint's claims
    hold (built from ``checkpoint`` when not given)."""
    if taken is None:
        taken = Holdings.of(checkpoint, handlers)
    else:
        taken.sync(checkpoint)
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
        owner = None if result.admin_access else taken.owner(keys, result.share_id, ref.uid)
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
