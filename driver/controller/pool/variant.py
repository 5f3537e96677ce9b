"""A fabric device as the pool offers it: one (device, node, adapter) variant.

Why a module: both pool shapes (``driver.controller.pool.devices``, a
variant per device, and ``driver.controller.pool.slots``, a count-based
manager's model slots), the attach workers and the spare keeper speak of
variants; what one is, the device a variant publishes (with the
attributes a node-local device of its kind carries), the counter that
makes a physical device's variants exclusive, and which devices are
offered at all are written here once. Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from driver.cxl import KIND as CXL_MEMORY
from driver.devices.model import (
    ATTACHMENT,
    PCI_BUS_ID,
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
    cxl_bdf_of,
    cxl_key,
    variant_name,
)
from driver.fabricclient.model import FabricDevice
from driver.nvme import KIND as NVME
from driver.slices import limits

COUNTER = "1"
# A warm spare's variant on its node (``driver.controller.spares.policy``) carries
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
    # driver.controller.pool.slots): device_id and identity are the slot id.
    count: bool = False
    # A device published once (``driver.controller.pool.domain_pool``): node,
    # adapter and root come from its allocation; the node prepares it under
    # its own variant's name.
    once: bool = False
    # Why a device published once has no adapter on its node, when it is not
    # the usual (no reported adapter reaches it): the claim's adapter does not.
    why: str = ""
    # Its adapter has no room for it (driver.controller.pool.room): ``why`` says
    # which; the attach is refused, the device not held.
    full: bool = False
    # CXL memory attached as a ready warm spare: the node's key of its memdev
    # (``<serial>@<BDF>``); the variant is then named as the node names that
    # memdev (:func:`as_memdev`; docs/fabric.md, "Logical devices").
    memdev: str = ""

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
        v = cls(device.name, dev_id, kind, ident, device.node_name, adapter, root)
        return dataclasses.replace(v, memdev=memdev_of(device, v))


def memdev_of(device: Device, v: Variant) -> str:
    """The memdev key a published CXL spare names (its ``pciBusID``), "" if none."""
    bdf = device.attributes.get(PCI_BUS_ID)
    return cxl_key(v.identity, bdf) if v.kind == CXL_MEMORY and isinstance(bdf, str) else ""


def as_memdev(v: Variant, memdev: str) -> Variant:
    """CXL memory ``v`` attached as the memdev ``memdev``, named as its node
    names that memdev (the LDs of one MLD share the serial: only the memdev
    tells them apart there); ``v`` as it is for "" (an older plugin's report)."""
    if not memdev:
        return v
    return dataclasses.replace(v, name=variant_name(memdev, v.node, v.adapter, v.kind),
                               memdev=memdev)  # fmt: skip


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
            name = variant_name(device.unique_identity, a.node, a.adapter, device.kind)
            out.append(
                Variant(name, device.id, device.kind, device.identity, a.node, a.adapter, root)
            )
    return out


def offered(device: FabricDevice) -> bool:
    return bool(device.identity) and device.available and device.health != "Critical"


def fabric_attributes(device: FabricDevice) -> tuple[dict[str, AttributeValue], dict[str, str]]:
    """The attributes and capacity a fabric device is published with, whichever
    pool shape: those a node-local device of its kind carries, and where it
    sits in the fabric (no root and no adapter: those are a variant's)."""
    attrs: dict[str, AttributeValue] = {
        "productName": device.model,
        "serial": device.serial,
        ATTACHMENT: "fabric",
        "fabricDevice": device.id,
        "fabricSwitch": device.switch,
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
    return attrs, capacity


def placed_device(device: FabricDevice, v: Variant) -> Device:
    """``device`` as ``v`` offers it through its adapter (root, adapter), with
    no counters or binding: what a variant and a ready spare share."""
    attrs, capacity = fabric_attributes(device)
    attrs |= {"fabricAdapter": v.adapter, PCIE_ROOT: v.root}
    if v.memdev:  # a CXL spare: the memdev it is attached as, as a local one says
        attrs[PCI_BUS_ID] = cxl_bdf_of(v.memdev)
    return Device(
        name=v.name,
        kind=PUBLISHED_TYPE[device.kind],
        local_id=device.identity,
        attributes=attrs,
        capacity=capacity,
    )


def variant_device(device: FabricDevice, v: Variant, counter_set: str) -> Device:
    return dataclasses.replace(
        placed_device(device, v),
        consumes_counters=consumption(device.id, counter_set),
        node_name=v.node,
        binds_to_node=True,
        binding_conditions=(READY_CONDITION,),
        binding_failure_conditions=(FAILED_CONDITION,),
    )
