"""A count-based manager's fabric: model slots in the pool, attaches that follow the
device the manager chose, and the plugin preparing the slot as that device.

The pool offers "one X on node N via adapter A" (as many slots as the
adapter reaches free devices of that model on a switch), bounded by one
counter per switch and model; an attach for a slot takes whatever device of
the model arrives, keeps it out of the detach path from the moment it is
named, and writes it into the claim's status data; the plugin's plan looks
the allocated slot up by that name. In-memory fabric and API (the shipped
doubles), real workers, reports, status writer and planner.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from driver.checkpoint import Checkpoint
from driver.claims.allocation import parse_allocation
from driver.claims.model import ClaimRef
from driver.claims.plan import plan_claim
from driver.controller import claims as cl
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.pool.domain_pool import DomainPool
from driver.controller.pool.domain_slot_pool import DomainSlotPool
from driver.controller.pool.model import DevicePool, SlotPool, pool_model
from driver.controller.pool.slots import (
    SLOT_ATTRIBUTE,
    build_count_pool,
    slot_group,
    slot_id,
    slot_variant,
)
from driver.devices.model import Device
from driver.errors import ClaimError
from driver.fabric_devices.naming import (
    NODE_ANNOTATION,
    PREPARED_AS_KEY,
    READY_CONDITION,
    NodeFabric,
    variant_name,
)
from driver.fabricclient import FabricClient
from driver.fabricclient.dialect_count import (
    CountAttachResult,
    CountDialect,
    CountResource,
    Machines,
)
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import AttachResult, FabricDevice, FabricInventory, HostAdapter
from driver.kube.api import RESOURCE_V1
from driver.kube.memory import MemoryKube

H100, H200 = "H100-SXM5-80GB", "H200-SXM5-141GB"
A0 = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
B0 = HostAdapter("node-b-a0", "pcie0", "sw0", "node-b", "adapter0")


def gpu(i: int, model: str = H100, health: str = "OK", adapters: Any = (A0, B0)) -> FabricDevice:
    return FabricDevice(
        f"gpu-{i}", "pcie0", "sw0", "gpu", model, f"S{i}", f"GPU-{i}", 0x10DE, 0x2330,
        health, True, False, tuple(adapters), None,  # type: ignore[arg-type]
    )  # fmt: skip


REPORTS = {n: NodeFabric({"adapter0": f"pci-{n}"}) for n in ("node-a", "node-b")}


def pool(devices: list[FabricDevice], **kw: Any) -> Any:
    inv = FabricInventory(tuple(devices), (A0, B0))
    args = {"excluded": (), "pinned": (), "carried": None} | kw
    return build_count_pool("fabric", inv, REPORTS, **args)


def test_slots_per_model_node_and_adapter_bounded_by_one_counter_per_switch_and_model() -> None:
    spec, variants = pool([gpu(0), gpu(1), gpu(2, H200), gpu(3, health="Critical")])
    counters = {c: v for s in spec.counter_sets for c, v in s.counters}
    assert counters == {f"sw0-{H100.lower()}": "2", f"sw0-{H200.lower()}": "1"}
    per_node: dict[tuple[str, str], int] = {}
    for v in variants.values():
        assert v.count and v.kind == "gpu"
        model = slot_group(v.device_id)[1]
        per_node[(v.node, model)] = per_node.get((v.node, model), 0) + 1
    # Each node may be allocated every free H100 the switch has; the counter
    # (2) keeps both nodes together from taking more than 2.
    assert per_node == {("node-a", H100): 2, ("node-b", H100): 2,
                        ("node-a", H200): 1, ("node-b", H200): 1}  # fmt: skip
    by_name = {d.name: d for d in spec.devices}
    first = slot_id("sw0", H100, "node-a", "adapter0", 0)
    slot = variant_name(first, "node-a", "adapter0")
    d = by_name[slot]
    assert d.attributes["productName"] == H100 and d.attributes[SLOT_ATTRIBUTE] == first
    assert "fabricDevice" not in d.attributes and "uuid" not in d.attributes
    assert d.binding_conditions == (READY_CONDITION,) and d.node_name == "node-a"
    ((counter, one),) = d.consumes_counters[0].counters
    assert (counter, one) == (f"sw0-{H100.lower()}", "1")
    assert slot_variant(d) == variants[slot]


def test_a_held_slot_is_left_out_and_an_allocated_slot_stays_published() -> None:
    slot = slot_id("sw0", H100, "node-a", "adapter0", 1)
    spec, variants = pool([gpu(0), gpu(1)], excluded={slot})
    held = {v.device_id for v in variants.values()}
    # That node's slot only: node-b keeps both of its H100 slots.
    assert slot not in held and slot_id("sw0", H100, "node-b", "adapter0", 1) in held
    allocated = variant_name(slot, "node-a", "adapter0")
    before, _ = pool([gpu(0), gpu(1)])
    carried = {d.name: d for d in before.devices}
    # gpu-1 went Critical: one free H100 left, one slot per node, but the
    # allocated second slot stays, consuming the counter that is left.
    spec, variants = pool([gpu(0), gpu(1, health="Critical")], pinned={allocated},
                          carried=carried)  # fmt: skip
    assert allocated in variants and variants[allocated].count
    kept = next(d for d in spec.devices if d.name == allocated)
    assert kept.consumes_counters[0].counters == ((f"sw0-{H100.lower()}", "1"),)
    # No free H100 at all: the counter is gone, the allocated slot consumes nothing.
    spec, variants = pool([gpu(1, health="Critical")], pinned={allocated}, carried=carried)
    assert [d.name for d in spec.devices] == [allocated] and not spec.devices[0].consumes_counters


class PickingFabric(MemoryFabric):
    """A count-based manager: whatever device is asked through, it attaches ``picks``."""

    picks_devices = True

    def __init__(self, devices: list[FabricDevice], picks: str) -> None:
        super().__init__(devices)
        self.picks, self.asked = picks, 0
        self.read = asyncio.Event()  # an inventory was read

    async def inventory(self) -> FabricInventory:
        self.read.set()
        return await super().inventory()

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        self.asked += 1
        await super().attach(self.picks, node, adapter, key)
        dev = self.devices[self.picks]
        arrived = CountResource(f"res-{dev.id}", dev.serial, dev.kind, dev.model, "OK")
        return CountAttachResult("/machines/m#res", None, arrived)


SLOT = variant_name(slot_id("sw0", H100, "node-a", "adapter0", 0), "node-a", "adapter0")
CLAIM: dict[str, Any] = {
    "metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": SLOT}
                ]
            }
        }
    },
}
ALLOC = cl.FabricAllocation("uid-1", "default", "claim", SLOT, ready=False, failed=False)


def node(gpus: dict[str, str], serials: dict[str, str]) -> dict[str, Any]:
    report = NodeFabric({"adapter0": "pci-node-a"}, gpus=gpus, serials=serials)
    return {
        "metadata": {"name": "node-a", "annotations": {NODE_ANNOTATION: report.to_annotation()}}
    }


async def test_the_attach_follows_the_device_the_manager_chose() -> None:
    fabric = PickingFabric([gpu(0), gpu(1)], picks="gpu-1")
    api, reports, done = MemoryKube(), NodeReports(), asyncio.Event()
    api.add(f"{RESOURCE_V1}/namespaces/default/resourceclaims", CLAIM)
    workers = Workers(fabric, ClaimStatusWriter(api, "fabric"), reports,
                      FailedHolds(300.0, lambda: None), 60.0, done.set)  # fmt: skip
    _, variants = pool([gpu(0), gpu(1)])
    reports.refresh({"node-a": node({}, {})})
    workers.attach(ALLOC, variants[SLOT])
    for _ in range(20):
        await asyncio.sleep(0)
    # Asked through gpu-0 (the first free H100); the manager chose gpu-1, and
    # from then on gpu-1 is this allocation's: no pass detaches it.
    assert fabric.attached == [("gpu-1", "node-a", "adapter0")] and fabric.asked == 1
    assert workers.served(ALLOC) == "gpu-1" and workers.busy("gpu-1")
    reports.refresh({"node-a": node({"GPU-1": "adapter0"}, {"S1": "GPU-1"})})
    async with asyncio.timeout(10):
        await done.wait()
    (claim,) = api.objects(f"{RESOURCE_V1}/namespaces/default/resourceclaims")
    (entry,) = claim["status"]["devices"]
    assert [c["type"] for c in entry["conditions"]] == [READY_CONDITION]
    assert entry["data"] == {
        "fabricDevice": "gpu-1", "uuid": "GPU-1", "adapter": "adapter0", "serial": "S1",
        PREPARED_AS_KEY: variant_name("GPU-1", "node-a", "adapter0"),
    }  # fmt: skip
    # Until the claims cache shows it, the served device is remembered here;
    # the cache's allocation carries it from then on.
    assert workers.served(ALLOC) == "gpu-1"
    (seen,) = cl.fabric_allocations(claim, "fabric")
    assert seen.ready and seen.served == "gpu-1"
    workers.forget(set())
    assert workers.served(ALLOC) == "" and workers.served(seen) == "gpu-1"
    # The node plugin prepares the allocated slot as the device that arrived.
    (result,) = parse_allocation(claim, "uid-1", {"fabric"}).devices
    assert result.device == SLOT and result.prepared_as == entry["data"][PREPARED_AS_KEY]


async def test_a_slot_whose_only_device_is_still_leaving_waits_for_it() -> None:
    """A released claim's device leaves after its node unprepared it; the
    scheduler may allocate its slot again before then. The attach waits
    for a free device of the model instead of failing the new claim."""
    fabric = PickingFabric([gpu(0)], picks="gpu-0")
    await MemoryFabric.attach(fabric, "gpu-0", "node-b", "adapter0")  # the last holder's
    api, reports, done = MemoryKube(), NodeReports(), asyncio.Event()
    api.add(f"{RESOURCE_V1}/namespaces/default/resourceclaims", CLAIM)
    holds = FailedHolds(300.0, lambda: None)
    workers = Workers(fabric, ClaimStatusWriter(api, "fabric"), reports, holds, 60.0, done.set)
    _, variants = pool([gpu(0)])
    reports.refresh({"node-a": node({"GPU-0": "adapter0"}, {"S0": "GPU-0"})})
    workers.attach(ALLOC, variants[SLOT])
    async with asyncio.timeout(10):
        await fabric.read.wait()  # it found no free H100 and waits
    asked_while_attached = fabric.asked
    assert asked_while_attached == 0
    await fabric.detach("gpu-0")  # gone from node-b: the slot's attach asks now
    async with asyncio.timeout(10):
        await done.wait()
    assert fabric.asked == 1 and fabric.attached[-1] == ("gpu-0", "node-a", "adapter0")
    (claim,) = api.objects(f"{RESOURCE_V1}/namespaces/default/resourceclaims")
    (entry,) = claim["status"]["devices"]
    assert [c["type"] for c in entry["conditions"]] == [READY_CONDITION]
    assert entry["data"]["fabricDevice"] == "gpu-0" and not holds.held()


def test_a_plain_allocation_has_nothing_to_prepare_as() -> None:
    (result,) = parse_allocation(CLAIM, "uid-1", {"fabric"}).devices
    assert result.prepared_as == ""
    other = dataclasses.replace(ALLOC)
    assert other.served == ""


class FabricInventoryOnNode:
    """The node plugin's inventory: its fabric pool holds the attached GPU under
    the node's own variant name of it (``FabricNodeView.split``)."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def pools(self) -> frozenset[str]:
        return frozenset({"fabric"})

    def lookup(self, pool: str, device: str) -> Device | None:
        return self.device if (pool, device) == ("fabric", self.device.name) else None


class Undo:
    blocking = False

    def plan_undo(self, device: Device, config: Any = None) -> dict[str, Any]:
        return {}


def test_the_plugin_plans_the_allocated_slot_as_the_device_that_arrived() -> None:
    here = variant_name("GPU-1", "node-a", "adapter0")
    inventory = FabricInventoryOnNode(Device(here, "gpu", "GPU-1"))
    handlers: Any = {"gpu": Undo()}
    ref = ClaimRef("default", "claim", "uid-1")
    plain = parse_allocation(CLAIM, "uid-1", {"fabric"})
    with pytest.raises(ClaimError, match=f"device {SLOT} of pool fabric is not on this node"):
        plan_claim(ref, plain, Checkpoint(), inventory, handlers, None)
    entry = {"driver": "patchbay.dev", "pool": "fabric", "device": SLOT,
             "data": {"fabricDevice": "gpu-1", PREPARED_AS_KEY: here}}  # fmt: skip
    claim = {**CLAIM, "status": {**CLAIM["status"], "devices": [entry]}}
    ((record, device, _),) = plan_claim(
        ref, parse_allocation(claim, "uid-1", {"fabric"}), Checkpoint(), inventory, handlers, None
    )
    # Recorded and named as allocated, prepared as the GPU that arrived.
    assert (record.device_name, record.local_id, device.local_id) == (SLOT, "GPU-1", "GPU-1")
    assert device.name == SLOT  # its CDI device is named as the kubelet asks for it


async def test_only_a_count_fabric_gets_model_slots() -> None:
    dialect = CountDialect(Machines({}), "tenant")
    count = FabricClient("http://fm.example", "token", dialect=dialect)
    redfish = FabricClient("http://fm.example", "token")
    try:
        assert count.picks_devices and not redfish.picks_devices
        assert not MemoryFabric([gpu(0)]).picks_devices
        assert isinstance(pool_model(count.picks_devices, "per-node"), SlotPool)
        assert isinstance(pool_model(redfish.picks_devices, "per-node"), DevicePool)
        assert isinstance(pool_model(count.picks_devices, "per-domain"), DomainSlotPool)
        assert isinstance(pool_model(redfish.picks_devices, "per-domain"), DomainPool)
    finally:
        await count.close()
        await redfish.close()
