"""A controller restart between a count-based manager's answer and the claim's status write.

The manager attached the device it chose, but the controller died before
the claim named it: either before it read the answer at all, or while it
waited for the node to report the device. The restarted controller must
take that device up for the allocation (it is attached to the slot's node,
of the slot's model, and nothing else needs it) instead of detaching it as
a leftover and asking again: exactly one scale-up, no scale-down, and the
claim ends Ready with the device that arrived. The real reconciler and
workers run on the shipped in-memory API and fabric (docs/fabric.md,
"Count-based managers").
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from driver.controller import claims as cl
from driver.controller.pool.slot_serving import take_up
from driver.controller.pool.slots import build_count_pool, slot_id
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import NODE_ANNOTATION, READY_CONDITION, NodeFabric, variant_name
from driver.fabricclient.dialect_count import (
    CountAttachResult,
    CountResource,
)
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricInventory,
    HostAdapter,
)
from driver.kube.api import RESOURCE_V1
from driver.kube.memory import MemoryKube
from tests.signals import Signal
from tests.unit.test_controller_spares_reconciler import running, settings

H100 = "H100-SXM5-80GB"
A0 = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
SLOT = variant_name(slot_id("sw0", H100, "node-a", "adapter0", 0), "node-a", "adapter0")
REPORT = NodeFabric({"adapter0": "pci0000:15"}, busy=frozenset({"GPU-0"}))
CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"


def gpu(i: int) -> FabricDevice:
    return FabricDevice(
        f"gpu-{i}", "pcie0", "sw0", "gpu", H100, f"S{i}", f"GPU-{i}", 0x10DE, 0x2330,
        "OK", True, False, (A0,), None,
    )  # fmt: skip


def claim() -> dict[str, Any]:
    result = {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": SLOT,
              "bindingConditions": [READY_CONDITION]}  # fmt: skip
    return {
        "metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


class World:
    """The API, a count-based manager, and node-a's plugin (its ``adapters``,
    adapter -> pcieRoot), which reports what is attached once ``live`` (until
    then it has not seen the device yet)."""

    def __init__(
        self, devices: list[FabricDevice], adapters: dict[str, str], live: bool = False,
        more: dict[str, dict[str, str]] | None = None,
    ) -> None:  # fmt: skip
        self.api, self.changed, self.live = MemoryKube(), Signal(), live
        self.nodes = {"node-a": adapters, **(more or {})}  # node -> its adapters
        self.fabric = Manager(devices, self)
        for node, ads in self.nodes.items():
            self.api.add("/api/v1/nodes", {"metadata": {"name": node, "annotations": {
                NODE_ANNOTATION: NodeFabric(ads).to_annotation()}}})  # fmt: skip
        self.api.on_store = lambda _path, _obj: self.changed.changed()

    async def report(self) -> None:
        if not self.live:
            return
        for node, adapters in self.nodes.items():
            conns = [(d, c) for d in self.fabric.devices.values()
                     if (c := d.connection) is not None and c.node == node]  # fmt: skip
            seen = NodeFabric(
                adapters,
                gpus={d.uuid: c.adapter for d, c in conns},
                serials={d.serial: d.uuid for d, _ in conns},
            )
            ann = {"metadata": {"annotations": {NODE_ANNOTATION: seen.to_annotation()}}}
            await self.api.merge_patch(f"/api/v1/nodes/{node}", ann)

    def entry(self) -> dict[str, Any]:
        (stored,) = self.api.objects(CLAIMS)
        return next(iter((stored.get("status") or {}).get("devices") or ()), {})

    def ready(self) -> bool:
        (stored,) = self.api.objects(CLAIMS)
        return any(a.ready for a in cl.fabric_allocations(stored, "fabric"))


class Manager(MemoryFabric):
    """A count-based manager: a scale-up attaches the last free device of the
    model asked for that the node reaches, on whichever switch (not the one
    asked through); ``lose_answers``: the controller dies before it reads the
    answer."""

    picks_devices = True  # as a count dialect: the manager picks the device

    def __init__(self, devices: list[FabricDevice], world: World) -> None:
        super().__init__(devices)
        self.world, self.scale_ups, self.lose_answers = world, 0, False

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        self.scale_ups += 1
        model = self.devices[device_id].model
        free = [d for _, d in sorted(self.devices.items()) if d.connection is None]
        reached = {d.id: a.adapter for d in free for a in d.adapters if a.node == node}
        picked = [d for d in free if d.model == model and d.id in reached][-1]
        await super().attach(picked.id, node, reached[picked.id], key)
        await self.world.report()
        self.world.changed.changed()
        if self.lose_answers:
            await asyncio.Event().wait()  # cancelled: the controller is gone
        arrived = CountResource(f"res-{picked.id}", picked.serial, "gpu", picked.model, "OK")
        return CountAttachResult(f"/machines/m#res-{picked.id}", None, arrived)

    async def detach(self, device_id: str) -> Any:
        task = await super().detach(device_id)
        await self.world.report()
        return task


@pytest.mark.parametrize("crash", ["before the answer is read", "while the node has not seen it"])
async def test_a_restart_takes_up_the_device_the_manager_attached(crash: str) -> None:
    w = World([gpu(0), gpu(1)], {"adapter0": "pci0000:15"})
    w.fabric.lose_answers = crash == "before the answer is read"
    w.api.add(CLAIMS, claim())
    alloc = cl.fabric_allocations(claim(), "fabric")[0]
    first = Reconciler(w.api, w.fabric, settings())
    async with running(first):
        if w.fabric.lose_answers:
            await w.changed.until("the manager's attach", lambda: w.fabric.attached != [])
        else:  # what arrived is on the claim before the wait for the node
            await w.changed.until("the device recorded on the claim", lambda: (
                w.entry().get("data") == {"fabricDevice": "gpu-1"}
            ))  # fmt: skip
            assert first.workers.served(alloc) == "gpu-1"
    assert w.fabric.attached == [("gpu-1", "node-a", "adapter0")] and not w.ready()
    # The restart: the node's plugin sees the device from now on.
    w.fabric.lose_answers, w.live = False, True
    await w.report()
    async with running(Reconciler(w.api, w.fabric, settings())):
        await w.changed.until("the claim Ready", w.ready)
    assert w.fabric.scale_ups == 1 and w.fabric.detached == []
    assert w.entry()["data"]["fabricDevice"] == "gpu-1" and w.entry()["data"]["uuid"] == "GPU-1"


class Workers:
    """The part of the workers :func:`take_up` reads, as plain sets."""

    def __init__(self, busy: set[str]) -> None:
        self.taken: dict[str, str] = {}
        self._busy = busy

    def served(self, a: cl.FabricAllocation) -> str:
        return a.served or self.taken.get(a.name, "")

    def busy(self, device_id: str) -> bool:
        return device_id in self._busy or device_id in self.taken.values()

    def settling(self, device_id: str) -> bool:
        return False

    def settled(self, a: cl.FabricAllocation) -> bool:
        return False

    def adopt(self, a: cl.FabricAllocation, device_id: str) -> None:
        self.taken[a.name] = device_id


def test_only_a_device_nothing_needs_is_taken_up_and_once() -> None:
    b0 = HostAdapter("node-b-a0", "pcie0", "sw0", "node-b", "adapter0")
    gpus = [gpu(i) for i in range(4)] + [dataclasses.replace(gpu(4), adapters=(b0,))]
    conn = {d: FabricConnection(f"c-{d}", "", d, "node-a", "adapter0", "Attached", "", None)
            for d in ("gpu-0", "gpu-1", "gpu-2", "gpu-3")}  # fmt: skip
    conn["gpu-4"] = dataclasses.replace(conn["gpu-0"], node="node-b")
    devices = [dataclasses.replace(d, connection=conn[d.id]) for d in gpus]
    inv = FabricInventory(tuple(devices), (A0, b0))
    slots = {i: variant_name(slot_id("sw0", H100, "node-a", "adapter0", i), "node-a", "adapter0")
             for i in range(4)}  # fmt: skip
    _, variants = build_count_pool("fabric", inv, {"node-a": REPORT}, (), ())

    def waiting(name: str, slot: int, served: str = "") -> cl.FabricAllocation:
        return cl.FabricAllocation(f"uid-{name}", "default", name, slots[slot], False, False,
                                   served=served)  # fmt: skip

    allocs = [
        waiting("holds-gpu-2", 0, served="gpu-2"),  # named on its claim
        waiting("attaching", 1),  # its attach runs: it asks itself
        waiting("first", 2),
        waiting("second", 3),
    ]
    workers = Workers(busy={variants[slots[1]].device_id, "gpu-3"})  # gpu-3: being detached
    take_up(inv, {"node-a": REPORT}, allocs, variants, workers)
    # gpu-0 is held prepared on node-a (a released claim's pod not gone yet),
    # gpu-2 is served, gpu-3 busy, gpu-4 on node-b: only gpu-1, and only once.
    assert workers.taken == {"first": "gpu-1"}
    # A warm spare (its own variant may be allocated any time) is never taken up.
    workers = Workers(busy={variants[slots[1]].device_id, "gpu-3"})
    take_up(inv, {"node-a": REPORT}, allocs, variants, workers, spares={"gpu-1"})
    assert workers.taken == {}
