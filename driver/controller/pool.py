"""Build the fabric pool from the fabric inventory and the nodes' reports.

Why: every free fabric GPU appears once per (node, adapter) that can reach
it, each variant with that node, that adapter's ``pcieRoot`` (reported by
the node plugin in its Node annotation: the fabric does not know roots), the
binding conditions that make the scheduler wait for the attach, and one
counter unique to the physical GPU so no two variants of it can ever be
allocated together. The pool depends only on the fabric inventory, the
nodes' reports, failed devices and pinned (allocated) variants, never on
attachments, so an attach or detach writes no slice. Pure functions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from driver import DRIVER_NAME
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
    READY_CONDITION,
    NodeFabric,
    counter_name,
    variant_name,
)
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.slices import limits
from driver.slices.build import PoolSpec, slice_name_prefix

COUNTER = "1"


@dataclass(frozen=True)
class Variant:
    """One published (device, node, adapter) combination."""

    name: str
    device_id: str
    uuid: str
    node: str
    adapter: str
    root: str


def counter_set_name(pool: str, index: int) -> str:
    return f"{pool}-devices-{index}"


def counter_sets(pool: str, gpus: list[FabricDevice]) -> tuple[dict[str, str], list[CounterSet]]:
    """One counter per GPU (value 1), 32 per set; device id -> its set."""
    per = limits.MAX_COUNTERS_PER_SET
    where: dict[str, str] = {}
    sets: list[CounterSet] = []
    for i in range(0, len(gpus), per):
        name = counter_set_name(pool, i // per)
        group = gpus[i : i + per]
        sets.append(CounterSet(name, tuple((counter_name(d.id), COUNTER) for d in group)))
        where.update({d.id: name for d in group})
    return where, sets


def reachable(device: FabricDevice, nodes: Mapping[str, NodeFabric]) -> list[Variant]:
    out = []
    for a in sorted(device.adapters, key=lambda a: (a.node, a.adapter)):
        report = nodes.get(a.node)
        root = report.adapters.get(a.adapter) if report is not None else None
        if root:
            name = variant_name(device.uuid, a.node, a.adapter)
            out.append(Variant(name, device.id, device.uuid, a.node, a.adapter, root))
    return out


def offered(device: FabricDevice) -> bool:
    return (
        device.kind == "gpu"
        and bool(device.uuid)
        and device.available
        and device.health != "Critical"
    )


def variant_device(device: FabricDevice, v: Variant, counter_set: str) -> Device:
    attrs: dict[str, AttributeValue] = {
        "uuid": device.uuid,
        "productName": device.model,
        "serial": device.serial,
        ATTACHMENT: "fabric",
        "fabricDevice": device.id,
        "fabricSwitch": device.switch,
        "fabricAdapter": v.adapter,
        "pciVendorID": f"{device.vendor_id:04x}",
        "pciDeviceID": f"{device.device_id:04x}",
        PCIE_ROOT: v.root,
    }
    return Device(
        name=v.name,
        kind="gpu",
        local_id=device.uuid,
        attributes=attrs,
        consumes_counters=(CounterConsumption(counter_set, ((counter_name(device.id), COUNTER),)),),
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
) -> tuple[PoolSpec, dict[str, Variant]]:
    """The pool spec and every variant in it by name.

    ``excluded``: device ids kept out entirely (failed attach, until their
    hold ends); ``pinned``: variant names allocated to a claim, which stay
    published as they are until deallocated (e.g. after a node's adapter
    or the device's health went away).
    """
    gpus = sorted((d for d in inventory.devices if d.kind == "gpu" and d.uuid), key=lambda d: d.id)
    where, sets = counter_sets(pool, gpus)
    devices: list[Device] = []
    variants: dict[str, Variant] = {}
    for gpu in gpus:  # GPU-major: a GPU's variants sit together
        if gpu.id in excluded:
            # All its variants go, the allocated one too: with no variant
            # left nothing can double-count it, and a scheduler that clears
            # the failed allocation cannot pick the same variant again.
            continue
        keep_all = offered(gpu)
        for v in reachable(gpu, nodes):
            if keep_all or v.name in pinned:
                devices.append(variant_device(gpu, v, where[gpu.id]))
                variants[v.name] = v
    spec = PoolSpec(
        driver=DRIVER_NAME,
        pool_name=pool,
        name_prefix=slice_name_prefix(pool, DRIVER_NAME),
        node_selection={"perDeviceNodeSelection": True},
        devices=tuple(devices),
        counter_sets=tuple(sets),
    )
    return spec, variants
