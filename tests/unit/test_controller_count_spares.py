"""Warm spares on a count-based manager's fabric (docs/fabric.md, "Count-based managers").

The keeper asks for one GPU of the model for a node and keeps what the
manager attached (another device than the one asked through); it is
published as its own variant on that node with no binding conditions,
consuming its switch's counter. A pod that takes it is Ready with no
scale-up, and the spare is replaced. Slots that only the spare's device can
serve get it: the spare is released, and the slot's scale-up brings it.
The real reconciler, workers and spare keeper run on the shipped in-memory
API and fabric.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from driver.controller import claims as cl
from driver.controller.pool.slots import slot_id
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import READY_CONDITION, counter_name, variant_name
from driver.fabricclient.model import HostAdapter
from driver.kube.api import slice_path
from tests.unit.controller_world import gpu as one_gpu
from tests.unit.controller_world import running, settings
from tests.unit.count_manager_world import CLAIMS, H100, World

B0 = HostAdapter("node-b-a0", "pcie0", "sw0", "node-b", "adapter0")
A0 = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
ROOTS = {"adapter0": "pci0000:15"}
RULES = {"spares_fixed": f"gpu:{H100}=1", "spares_cap": 0.5}  # one spare: half of two


def world() -> World:
    """sw0's two H100s, reached by node-a and node-b."""
    gpus = [dataclasses.replace(one_gpu(i), adapters=(A0, B0)) for i in range(2)]
    return World(gpus, ROOTS, live=True, more={"node-b": ROOTS})


def devices(w: World) -> dict[str, dict[str, Any]]:
    slices = w.api.objects(slice_path())
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}


def spares(w: World) -> list[str]:
    return sorted(n for n, d in devices(w).items() if d["attributes"]["spare"]["bool"])


def claim(name: str, device: str, waits: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric",
                              "device": device}  # fmt: skip
    if waits:
        result["bindingConditions"] = [READY_CONDITION]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def ready(w: World) -> dict[str, str]:
    """Claim name -> the device it is Ready with."""
    out = {}
    for c in w.api.objects(CLAIMS):
        for a in cl.fabric_allocations(c, "fabric"):
            if a.ready:
                out[a.name] = a.served
    return out


async def test_a_spare_is_what_arrived_and_a_pod_takes_it_with_no_scale_up() -> None:
    w = world()
    spare = variant_name("GPU-1", "node-a", "adapter0")
    async with running(
        Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node", **RULES))
    ):
        await w.changed.until("a spare published", lambda: spares(w) != [])
        # Asked through gpu-0 (the first free H100); the manager chose gpu-1.
        assert spares(w) == [spare] and w.fabric.scale_ups == 1
        published = devices(w)[spare]
        assert "bindingConditions" not in published and "bindsToNode" not in published
        assert published["attributes"]["fabricDevice"] == {"string": "gpu-1"}
        (use,) = published["consumesCounters"]
        assert list(use["counters"]) == [counter_name(f"sw0-{H100}")]
        # A pod takes it: Ready on gpu-1 without a scale-up; a new spare replaces it.
        w.api.add(CLAIMS, claim("takes", spare, waits=False))
        await w.changed.until("the claim Ready", lambda: ready(w) == {"takes": "gpu-1"})
        replacement = variant_name("GPU-0", "node-a", "adapter0")
        await w.changed.until("the replacement spare", lambda: spares(w) == [replacement])
    assert w.fabric.scale_ups == 2 and w.fabric.detached == []


async def test_slots_that_only_a_spares_device_can_serve_get_it() -> None:
    w = world()
    slots = [variant_name(slot_id("sw0", H100, "node-b", "adapter0", i), "node-b", "adapter0")
             for i in range(2)]  # fmt: skip
    async with running(
        Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node", **RULES))
    ):
        await w.changed.until("a spare published", lambda: spares(w) != [])
        assert spares(w) == [variant_name("GPU-1", "node-a", "adapter0")]
        # Two slots of node-b: gpu-0 is free, gpu-1 is node-a's spare.
        for i, slot in enumerate(slots):
            w.api.add(CLAIMS, claim(f"slot{i}", slot, waits=True))
        await w.changed.until("both claims Ready", lambda: len(ready(w)) == 2, 30.0)
        assert sorted(ready(w).values()) == ["gpu-0", "gpu-1"]
        assert spares(w) == [] and w.fabric.detached == ["gpu-1"]
    assert w.fabric.scale_ups == 3  # the spare, and one per slot


async def test_a_restart_keeps_the_spare_it_finds() -> None:
    w = world()
    async with running(
        Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node", **RULES))
    ):
        await w.changed.until("a spare published", lambda: spares(w) != [])
    (spare,) = spares(w)
    rec = Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node", **RULES))
    keep = rec.spares.reconcile

    def noted(*args: Any) -> Any:  # each of its passes wakes the wait below
        view = keep(*args)
        w.changed.changed()
        return view

    rec.spares.reconcile = noted  # type: ignore[method-assign,assignment]
    async with running(rec):
        await w.changed.until("the restart's pass", lambda: bool(rec.spares.last.keep))
        async with asyncio.timeout(5.0):
            await rec.publisher.in_sync.wait()
    assert spares(w) == [spare] and w.fabric.scale_ups == 1 and w.fabric.detached == []
