"""The fabric pool of a manager that attaches the device it is asked for: one variant per device.

Why: every free fabric device appears once per (node, adapter) that can
reach it, each variant with that node, that adapter's ``pcieRoot`` (reported
by the node plugin in its Node annotation: the fabric does not know roots),
the binding conditions that make the scheduler wait for the attach, and one
counter unique to the physical device so no two variants of it can ever be
allocated together (``driver.controller.pool.variant``). A GPU is offered
as a ``gpu``, an NVMe drive as an ``nvme``, CXL memory as a ``cxlmem``
(with the attributes and capacity a node-local one carries); a NIC as one
``vf`` (its VF 0): the NIC is attached whole for that claim, because
counters cannot keep two claims' VFs of one NIC on the same node. The pool
depends only on the fabric inventory, the nodes' reports, failed devices
and pinned (allocated) variants, never on attachments, so an attach or
detach writes no slice. Laid out node-major (``driver.controller.pool.layout``).

A count-based manager picks the device itself: for such a fabric the pool
offers model slots instead (``driver.controller.pool.slots``). Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from driver.controller.pool.layout import node_major
from driver.controller.pool.variant import (
    Variant,
    consumption,
    counter_sets,
    offered,
    reachable,
    variant_device,
)
from driver.devices.model import Device
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.slices.build import PoolSpec


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
    # Node-major (driver.controller.pool.layout), each node's by device id.
    by_device = {d.name: variants[d.name].device_id for d in devices}
    return node_major(
        pool, devices, sets, lambda d: (d.node_name or "", by_device[d.name])
    ), variants
