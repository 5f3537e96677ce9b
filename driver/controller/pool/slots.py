"""The fabric pool of a count-based manager: one variant per model slot, not per device.

Why a module: a manager of the ``count`` dialect (docs/fabric.md,
"Count-based managers") attaches "one device of model X to machine M" and
picks the device itself, so a variant naming one physical device promises
what the controller cannot keep. For such a fabric the pool offers, for each
switch, model, node and adapter, as many *slots* as the switch has free
devices of that model that the adapter reaches ("one X on node N via
adapter A"); every slot of a switch and model consumes one unit of that
switch-and-model's counter, whose value is the number of its free devices.
So the scheduler never allocates more of a model behind a switch than the
manager can still attach, whichever device it then picks. The attach
follows the device that arrived (``driver.controller.attach.slot_attach``), and the
node plugin prepares the allocated slot by the identity the controller wrote
into the claim's status data (``naming.PREPARED_AS_KEY``).

The manager may serve a node that reaches several switches with the model
from any of them, not only the slot's: an allocated slot whose device
arrived consumes the counter of that device's switch instead (``served``),
so each counter's remainder stays what its switch still has free.

A warm spare is published as its own device variant instead
(``driver.controller.pool.slot_spares``); allocated, it is carried like a slot.

A slot is named like a device variant, from its slot id
(``<switch>/<model>/<node>/<adapter>/<i>``) instead of an identity. Allocated slots stay
published until deallocated, also once their switch has fewer free devices
(taken from the devices published before, as ``driver.controller.pool.devices`` does).
Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from driver.controller.pool.layout import node_major
from driver.controller.pool.variant import Variant, counter_set_name, offered
from driver.devices.model import (
    ATTACHMENT,
    PCIE_ROOT,
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
)
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    PUBLISHED_TYPE,
    READY_CONDITION,
    SPARE_ATTRIBUTE,
    NodeFabric,
    counter_name,
    variant_name,
)
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.slices import limits
from driver.slices.build import PoolSpec

SLOT_ATTRIBUTE = "fabricSlot"  # a count variant's slot id, instead of fabricDevice

Group = tuple[str, str, str]  # (switch, kind, model)


def slot_id(switch: str, model: str, node: str, adapter: str, i: int) -> str:
    """A slot's id, unique per variant: what its attach and its hold are keyed by
    (a failed attach holds that node's slot out, not the model everywhere)."""
    return f"{switch}/{model}/{node}/{adapter}/{i}"


def slot_group(slot: str) -> tuple[str, str]:
    """(switch, model) of a slot id."""
    parts = slot.split("/")
    return parts[0], "/".join(parts[1:-3])


def slot_variant(device: Device) -> Variant | None:
    """The slot a published count variant stands for (None if not one)."""
    a = device.attributes
    fields = (a.get(SLOT_ATTRIBUTE), a.get("fabricAdapter"), a.get(PCIE_ROOT))
    if not device.node_name or not all(isinstance(f, str) and f for f in fields):
        return None
    slot, adapter, root = (str(f) for f in fields)
    kind = {v: k for k, v in PUBLISHED_TYPE.items()}.get(device.kind, "gpu")
    return Variant(device.name, slot, kind, slot, device.node_name, adapter, root, count=True)


def _groups(devices: list[FabricDevice]) -> dict[Group, list[FabricDevice]]:
    out: dict[Group, list[FabricDevice]] = {}
    for d in sorted(devices, key=lambda d: d.id):
        out.setdefault((d.switch, d.kind, d.model), []).append(d)
    return out


def _attributes(group: Group, first: FabricDevice, v: Variant) -> dict[str, AttributeValue]:
    switch, kind, model = group
    attrs: dict[str, AttributeValue] = {
        "productName": model,
        ATTACHMENT: "fabric",
        SLOT_ATTRIBUTE: v.device_id,
        "fabricSwitch": switch,
        "fabricAdapter": v.adapter,
        PCIE_ROOT: v.root,
        SPARE_ATTRIBUTE: False,
    }
    if kind == "gpu":
        attrs |= {
            "pciVendorID": f"{first.vendor_id:04x}",
            "pciDeviceID": f"{first.device_id:04x}",
        }
    return attrs


def build_count_pool(
    pool: str,
    inventory: FabricInventory,
    nodes: Mapping[str, NodeFabric],
    excluded: Collection[str],
    pinned: Collection[str],
    carried: Mapping[str, Device] | None = None,
    served: Mapping[str, str] | None = None,
) -> tuple[PoolSpec, dict[str, Variant]]:
    """The pool spec and its slot variants by name (arguments as ``devices.build_pool``'s;
    ``excluded`` holds slot ids after a failed attach; ``served``: allocated slot
    variant -> the device that arrived for it)."""
    free = _groups([d for d in inventory.devices if offered(d)])
    came_from = {d.id: (d.switch, d.kind, d.model) for d in inventory.devices}
    counters = {g: counter_name(f"{g[0]}-{g[2]}") for g in free}
    per = limits.MAX_COUNTERS_PER_SET
    names = sorted(free)
    set_of = {g: counter_set_name(pool, i // per) for i, g in enumerate(names)}
    sets = [
        CounterSet(
            counter_set_name(pool, i // per),
            tuple((counters[g], str(len(free[g]))) for g in names[i : i + per]),
        )
        for i in range(0, len(names), per)
    ]

    def use(name: str, group: Group) -> tuple[CounterConsumption, ...]:
        # Charged to the switch its device came from, once one arrived (the
        # manager may serve a node from any switch it reaches).
        group = came_from.get((served or {}).get(name, ""), group)
        if group not in counters:  # no free device of its model left there: none
            return ()
        return (CounterConsumption(set_of[group], ((counters[group], "1"),)),)

    devices: list[Device] = []
    variants: dict[str, Variant] = {}
    for group, members in free.items():
        switch, kind, model = group
        reach: dict[tuple[str, str], int] = {}
        for d in members:
            for a in d.adapters:
                reach[(a.node, a.adapter)] = reach.get((a.node, a.adapter), 0) + 1
        for (node, adapter), n in sorted(reach.items()):
            root = (nodes.get(node) or NodeFabric()).adapters.get(adapter)
            for i in range(n):
                slot = slot_id(switch, model, node, adapter, i)
                if not root or slot in excluded:
                    continue
                name = variant_name(slot, node, adapter, kind)
                v = Variant(name, slot, kind, slot, node, adapter, root, count=True)
                variants[name] = v
                devices.append(
                    Device(
                        name=name,
                        kind=PUBLISHED_TYPE[kind],
                        local_id=slot,
                        attributes=_attributes(group, members[0], v),
                        consumes_counters=use(name, group),
                        node_name=node,
                        binds_to_node=True,
                        binding_conditions=(READY_CONDITION,),
                        binding_failure_conditions=(FAILED_CONDITION,),
                    )
                )
    for name in sorted(set(pinned) - set(variants)):  # allocated: stays published
        old = (carried or {}).get(name)
        # A slot, or a warm spare's device variant (driver.controller.pool.slot_spares).
        kept = (slot_variant(old) or Variant.of(old)) if old is not None else None
        if old is not None and kept is not None and kept.device_id not in excluded:
            at = old.attributes
            group = (str(at.get("fabricSwitch")), kept.kind, str(at.get("productName")))
            devices.append(dataclasses.replace(old, consumes_counters=use(name, group)))
            variants[name] = kept
    return node_major(pool, devices, sets), variants  # node-major, by name
