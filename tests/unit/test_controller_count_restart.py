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

import pytest

from driver.controller import claims as cl
from driver.controller.pool.slot_serving import take_up
from driver.controller.pool.slots import build_count_pool, slot_id
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import NodeFabric, variant_name
from driver.fabricclient.model import (
    FabricConnection,
    FabricInventory,
    HostAdapter,
)
from driver.kube.api import slice_path
from tests.signals import LogSignal
from tests.unit.controller_world import running, settings
from tests.unit.count_manager_world import A0, CLAIMS, H100, World, claim, gpu

REPORT = NodeFabric({"adapter0": "pci0000:15"}, busy=frozenset({"GPU-0"}))


@pytest.mark.parametrize("shape", ["per-node", "per-domain"])
@pytest.mark.parametrize("crash", ["before the answer is read", "while the node has not seen it"])
async def test_a_restart_takes_up_the_device_the_manager_attached(crash: str, shape: str) -> None:
    w = World([gpu(0), gpu(1)], {"adapter0": "pci0000:15"})
    w.fabric.lose_answers = crash == "before the answer is read"
    w.api.add(CLAIMS, claim(shape))
    alloc = cl.fabric_allocations(claim(shape), "fabric")[0]
    first = Reconciler(w.api, w.fabric, settings(fabric_pool_shape=shape))
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
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape=shape))):
        await w.changed.until("the claim Ready", w.ready)
    assert w.fabric.scale_ups == 1 and w.fabric.detached == []
    assert w.entry()["data"]["fabricDevice"] == "gpu-1" and w.entry()["data"]["uuid"] == "GPU-1"


async def test_a_restart_withdraws_no_pool_before_its_first_full_pass() -> None:
    """The new leader lists the stored slices long before it has read the
    fabric (a slow manager): until its first full pass says which pools it
    wants, every stored pool stays as it is. Withdrawing the fabric pool
    then (it wants none yet) unpublished the allocated slot under its claim
    and lost the device that had arrived: a second scale-up."""
    w = World([gpu(0), gpu(1)], {"adapter0": "pci0000:15"})
    w.api.add(CLAIMS, claim())
    async with running(Reconciler(w.api, w.fabric, settings())):
        await w.changed.until("the device recorded on the claim", lambda: (
            w.entry().get("data") == {"fabricDevice": "gpu-1"}
        ))  # fmt: skip
    before = {s["metadata"]["name"]: s["metadata"]["uid"] for s in w.api.objects(slice_path())}
    assert before and not w.ready()
    w.live = True
    await w.report()
    read = w.fabric.pause()  # the restarted controller's first fabric read is slow
    rec, asked = Reconciler(w.api, w.fabric, settings()), len(w.api.requests)
    with LogSignal.on("driver.controller.reconciler") as log:
        async with running(rec):
            # Claims, Nodes and slices are listed; only the fabric is awaited.
            await log.until_logged("reconcile waits for: fabric inventory")
            for _ in range(5):
                await asyncio.sleep(0)  # the publisher's turn, had it one to take
            deleted = [p for m, p in w.api.requests[asked:] if m == "DELETE"]
            assert deleted == [], "a pool was withdrawn before the first full pass"
            read.set()
            await w.changed.until("the claim Ready", w.ready)
    assert [p for m, p in w.api.requests[asked:] if m == "DELETE"] == []
    after = {s["metadata"]["name"]: s["metadata"]["uid"] for s in w.api.objects(slice_path())}
    assert after.keys() >= before.keys() and all(after[n] == u for n, u in before.items())
    assert w.fabric.scale_ups == 1 and w.fabric.detached == []
    assert w.entry()["data"]["fabricDevice"] == "gpu-1"


class Workers:
    """The part of the workers :func:`take_up` reads, as plain sets."""

    def __init__(self, busy: set[str]) -> None:
        self.taken: dict[str, str] = {}
        self._busy = busy
        self.scaling: set[str] = set()  # nodes with a scale-up under way

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

    def scaling_up(self, node: str) -> bool:
        return node in self.scaling


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
    # Nor while a scale-up for node-a is under way: gpu-1 may be its answer,
    # another allocation's (test_controller_count_answer).
    workers = Workers(busy={variants[slots[1]].device_id, "gpu-3"})
    workers.scaling = {"node-a"}
    take_up(inv, {"node-a": REPORT}, allocs, variants, workers)
    assert workers.taken == {}
