"""Build the fabric pool from the fabric inventory and the nodes' reports.

Why: every free fabric device appears once per (node, adapter) that can
reach it, each variant with that node, that adapter's ``pcieRoot`` (reported
by the node plugin in its Node annotation: the fabric does not know roots),
the binding conditions that make the scheduler wait for the attach, and one
counter unique to the physical device so no two variants of it can ever be
allocated together. A GPU is offered as a ``gpu``, an NVMe drive as an
``nvme``, CXL memory as a ``cxlmem`` (with the attributes and capacity a
node-local one carries); a NIC as one ``vf`` (its VF 0): the NIC is attached
whole for that claim, because counters cannot keep two claims' VFs of one
NIC on the same node. The pool depends only on the fabric inventory, the
nodes' reports, failed devices and pinned (allocated) variants, never on
attachments, so an attach or detach writes no slice.

A count-based manager picks the device itself: for such a fabric the pool
offers model slots instead (``driver.controller.count_pool``).

Layout: node-major, one node's variants per slice (cut again only past 64
devices). The scheduler skips a slice for a node when none of its devices
sits on that node, and otherwise evaluates the class's CEL selectors on every
device before checking its node; with GPU-major slices every node has a
device in every slice, so every claim in the cluster paid for the whole
pool (``tests/bench/sched_bench.py``: 4096 variants, 383 ms scheduler CPU
per local-GPU pod GPU-major, 125 ms node-major). A GPU-major layout's other
promise, one GPU's change rewriting one slice, does not hold anyway: any
change rewrites every slice of the pool at a new generation (API rule).
Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from driver import DRIVER_NAME
from driver.cxl import KIND as CXL_MEMORY
from driver.devices.model import (
    ATTACHMENT,
    PCIE_ROOT,
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
)
from driver.devices.quantity import of_bytes
from driver.fabric_devices.naming import (
    FABRIC_KIND,
    FAILED_CONDITION,
    IDENTITY_ATTRIBUTE,
    PUBLISHED_TYPE,
    READY_CONDITION,
    SPARE_ATTRIBUTE,
    NodeFabric,
    counter_name,
    variant_name,
)
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.nvme import KIND as NVME
from driver.slices import limits
from driver.slices.build import PoolSpec, slice_name_prefix

COUNTER = "1"
# A warm spare's variant on its node (``driver.controller.spares``) carries
# ``spare: true`` and no binding conditions; every other variant ``spare: false``,
# so a selector or a prioritized list can test it without ``has()``.


@dataclass(frozen=True)
class Variant:
    """One published (device, node, adapter) combination."""

    name: str
    device_id: str
    kind: str  # fabric kind: "gpu", "nic", "nvme" or "cxlmem"
    identity: str  # what the node reports once attached: GPU UUID, NIC MAC, serial
    node: str
    adapter: str
    root: str
    # A count-based manager's slot ("one X on node N via adapter A":
    # driver.controller.count_pool): device_id and identity are the slot id.
    count: bool = False

    @classmethod
    def of(cls, device: Device) -> Variant | None:
        """The variant a published fabric device stands for (None if not one)."""
        a = device.attributes
        kind = FABRIC_KIND.get(device.kind, "nic")
        identity = a.get(IDENTITY_ATTRIBUTE[kind])
        fields = (a.get("fabricDevice"), identity, a.get("fabricAdapter"), a.get(PCIE_ROOT))
        if not device.node_name or not all(isinstance(f, str) and f for f in fields):
            return None
        dev_id, ident, adapter, root = (str(f) for f in fields)
        return cls(device.name, dev_id, kind, ident, device.node_name, adapter, root)


def counter_set_name(pool: str, index: int) -> str:
    return f"{pool}-devices-{index}"


def counter_sets(pool: str, ids: list[str]) -> tuple[dict[str, str], list[CounterSet]]:
    """One counter per device id (value 1), 32 per set; device id -> its set."""
    per = limits.MAX_COUNTERS_PER_SET
    where: dict[str, str] = {}
    sets: list[CounterSet] = []
    for i in range(0, len(ids), per):
        name = counter_set_name(pool, i // per)
        group = ids[i : i + per]
        sets.append(CounterSet(name, tuple((counter_name(d), COUNTER) for d in group)))
        where.update({d: name for d in group})
    return where, sets


def consumption(device_id: str, counter_set: str) -> tuple[CounterConsumption, ...]:
    return (CounterConsumption(counter_set, ((counter_name(device_id), COUNTER),)),)


def reachable(device: FabricDevice, nodes: Mapping[str, NodeFabric]) -> list[Variant]:
    out = []
    for a in sorted(device.adapters, key=lambda a: (a.node, a.adapter)):
        report = nodes.get(a.node)
        root = report.adapters.get(a.adapter) if report is not None else None
        if root:
            name = variant_name(device.identity, a.node, a.adapter, device.kind)
            out.append(
                Variant(name, device.id, device.kind, device.identity, a.node, a.adapter, root)
            )
    return out


def offered(device: FabricDevice) -> bool:
    return bool(device.identity) and device.available and device.health != "Critical"


def variant_device(device: FabricDevice, v: Variant, counter_set: str) -> Device:
    attrs: dict[str, AttributeValue] = {
        "productName": device.model,
        "serial": device.serial,
        ATTACHMENT: "fabric",
        "fabricDevice": device.id,
        "fabricSwitch": device.switch,
        "fabricAdapter": v.adapter,
        PCIE_ROOT: v.root,
        SPARE_ATTRIBUTE: False,
    }
    capacity: dict[str, str] = {}
    if device.kind == "gpu":
        attrs |= {
            "uuid": device.uuid,
            "pciVendorID": f"{device.vendor_id:04x}",
            "pciDeviceID": f"{device.device_id:04x}",
        }
    elif device.kind in (NVME, CXL_MEMORY):  # the names a local drive carries
        attrs |= {"model": device.model}
        if device.kind == CXL_MEMORY:
            attrs |= {"mode": "devdax"}
        if device.capacity_bytes:
            capacity["capacity"] = of_bytes(device.capacity_bytes)
    else:  # the same names a local VF carries, so one selector fits both
        attrs |= {
            "macAddress": device.mac,
            "vendorID": f"{device.vendor_id:04x}",
            "pfDeviceID": f"{device.device_id:04x}",
            "vfIndex": 0,
        }
    return Device(
        name=v.name,
        kind=PUBLISHED_TYPE[device.kind],
        local_id=device.identity,
        attributes=attrs,
        capacity=capacity,
        consumes_counters=consumption(device.id, counter_set),
        node_name=v.node,
        binds_to_node=True,
        binding_conditions=(READY_CONDITION,),
        binding_failure_conditions=(FAILED_CONDITION,),
    )


def build_pool(
    pool: str,
    inventory: FabricInventory,
    nodes: Mapping[str, NodeFabric],
    excluded: Collection[str],
    pinned: Collection[str],
    carried: Mapping[str, Device] | None = None,
) -> tuple[PoolSpec, dict[str, Variant]]:
    """The pool spec and every variant in it by name.

    ``excluded``: device ids kept out entirely (failed attach, until their
    hold ends), the allocated variant too: with no variant left nothing can
    double-count the device, and a scheduler that clears the failed
    allocation cannot pick the same variant again; ``pinned``: variant names
    allocated to a claim, which stay published until deallocated, also after
    the device's health, its node's adapter or the device itself left the
    inventory: such a variant is taken from ``carried`` (the devices
    published before, by name).
    """
    devices_in = sorted((d for d in inventory.devices if d.identity), key=lambda d: d.id)
    rebuilt: dict[str, tuple[FabricDevice, list[Variant]]] = {
        d.id: (d, reachable(d, nodes)) for d in devices_in if d.id not in excluded
    }
    built = {v.name for _, vs in rebuilt.values() for v in vs}
    kept: list[tuple[Device, Variant]] = []
    for name in sorted(set(pinned) - built):
        old = (carried or {}).get(name)
        v = Variant.of(old) if old is not None else None
        if old is not None and v is not None and v.device_id not in excluded:
            kept.append((old, v))
    ids = sorted({d.id for d in devices_in} | {v.device_id for _, v in kept})
    where, sets = counter_sets(pool, ids)
    devices: list[Device] = []
    variants: dict[str, Variant] = {}
    for dev, vs in rebuilt.values():
        keep_all = offered(dev)
        for v in vs:
            if keep_all or v.name in pinned:
                devices.append(variant_device(dev, v, where[dev.id]))
                variants[v.name] = v
    for old, v in kept:  # consumption re-pointed at the device's current counter set
        devices.append(
            dataclasses.replace(old, consumes_counters=consumption(v.device_id, where[v.device_id]))
        )
        variants[v.name] = v
    # Node-major: one slice per node (see the module docstring).
    devices.sort(key=lambda d: (variants[d.name].node, variants[d.name].device_id))
    node_index = {n: i for i, n in enumerate(sorted({v.node for v in variants.values()}))}
    spec = PoolSpec(
        driver=DRIVER_NAME,
        pool_name=pool,
        name_prefix=slice_name_prefix(pool, DRIVER_NAME),
        node_selection={"perDeviceNodeSelection": True},
        devices=tuple(devices),
        counter_sets=tuple(sets),
        slice_of={d.name: node_index[variants[d.name].node] for d in devices},
    )
    return spec, variants


def mark_spares(spec: PoolSpec, names: Collection[str]) -> PoolSpec:
    """``spec`` with the variants ``names`` (ready warm spares) as spares:
    ``spare: true``, no binding conditions (the device is there already);
    the same counter, so the device's other variants stay exclusive of it."""
    if not names:
        return spec
    devices = tuple(
        dataclasses.replace(
            d,
            attributes={**d.attributes, SPARE_ATTRIBUTE: True},
            binds_to_node=False,
            binding_conditions=(),
            binding_failure_conditions=(),
        )
        if d.name in names
        else d
        for d in spec.devices
    )
    return dataclasses.replace(spec, devices=devices)


def device_states(
    inventory: FabricInventory | None, held: Collection[str]
) -> list[tuple[tuple[str, str], float]]:
    """``patchbay_fabric_devices`` samples: (type, state) and a count, every
    state of each type present. A device is attached (a connection, also one
    on its way in or out), else held (after a failed attach), else
    unavailable (another tenant's, or health Critical), else free."""
    counts: dict[tuple[str, str], int] = {}
    for d in inventory.devices if inventory is not None else ():
        if d.connection is not None:
            state = "attached"
        elif d.id in held:
            state = "held"
        elif not d.available or d.health == "Critical":
            state = "unavailable"
        else:
            state = "free"
        counts[(d.kind, state)] = counts.get((d.kind, state), 0) + 1
    kinds = sorted({k for k, _ in counts})
    states = ("free", "attached", "held", "unavailable")
    return [((k, s), float(counts.get((k, s), 0))) for k in kinds for s in states]
