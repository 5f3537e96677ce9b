"""Warm spares through the real reconciler, on the shipped in-memory API and fabric.

A fixed spare is attached, published without binding conditions once its
node reports it, and kept by a restarted controller without a new attach;
a demand-driven spare follows a claim's allocation and is detached once
idle past its timeout on the reconciler's injected clock (no waiting).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from driver.controller.process.settings import ControllerSettings
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric, variant_name
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import AttachResult, FabricDevice, HostAdapter
from driver.kube.api import RESOURCE_V1, slice_path
from driver.kube.memory import MemoryKube
from tests.signals import Signal

MODEL = "H100-SXM5-80GB"
ADAPTER = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")


def gpu(n: int) -> FabricDevice:
    return FabricDevice(
        f"gpu-{n}", "pcie0", "sw0", "gpu", MODEL, f"S{n}", f"GPU-{n}", 0x10DE, 0x2330,
        "OK", True, False, (ADAPTER,), None,
    )  # fmt: skip


def node(seen: dict[str, str]) -> dict[str, Any]:
    report = NodeFabric({"adapter0": "pci0000:15"}, gpus=seen).to_annotation()
    return {"metadata": {"name": "node-a", "annotations": {NODE_ANNOTATION: report}}}


class World:
    """The API, the fabric, and a node plugin that reports what is attached."""

    def __init__(self, gpus: int) -> None:
        self.api, self.changed = MemoryKube(), Signal()
        self.fabric = Fabric([gpu(i) for i in range(gpus)], self)
        self.api.add("/api/v1/nodes", node({}))
        self.api.on_store = lambda _path, _obj: self.changed.changed()

    async def report(self) -> None:
        """The node plugin: the node sees every device attached to it."""
        seen = {
            d.uuid: d.connection.adapter
            for d in self.fabric.devices.values()
            if d.connection is not None and d.connection.state == "Attached"
        }
        ann = {NODE_ANNOTATION: NodeFabric({"adapter0": "pci0000:15"}, gpus=seen).to_annotation()}
        await self.api.merge_patch("/api/v1/nodes/node-a", {"metadata": {"annotations": ann}})

    def devices(self) -> dict[str, dict[str, Any]]:
        stored = self.api.objects(slice_path())
        return {d["name"]: d for s in stored for d in s["spec"].get("devices") or ()}

    def spares(self) -> list[str]:
        return sorted(n for n, d in self.devices().items() if d["attributes"]["spare"]["bool"])


class Fabric(MemoryFabric):
    def __init__(self, devices: list[FabricDevice], world: World) -> None:
        super().__init__(devices)
        self.world = world

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        result = await super().attach(device_id, node, adapter, key)
        await self.world.report()
        return result

    async def detach(self, device_id: str) -> Any:
        task = await super().detach(device_id)
        await self.world.report()
        return task


def settings(**spares: Any) -> ControllerSettings:
    return ControllerSettings(
        fabric_url="http://fabric", fabric_token="t", fabric_refresh=300, fabric_insecure=True,
        **spares,
    )  # fmt: skip


@contextmanager
def clock(rec: Reconciler, start: float = 1000.0) -> Iterator[list[float]]:
    now = [start]
    rec.clock = lambda: now[0]
    yield now


@asynccontextmanager
async def running(rec: Reconciler) -> AsyncIterator[None]:
    task = asyncio.create_task(rec.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_fixed_spare_is_published_without_binding_conditions_and_survives_a_restart() -> (
    None
):
    w = World(gpus=2)
    spare_gpu1 = variant_name("GPU-1", "node-a", "adapter0")
    taken_gpu0 = variant_name("GPU-0", "node-a", "adapter0")
    rules = settings(spares_fixed=f"gpu:{MODEL}=1", spares_cap=0.5)
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("a spare published", lambda: w.spares() != [])
    (name,) = w.spares()
    spare = w.devices()[name]
    assert "bindingConditions" not in spare and "bindsToNode" not in spare
    other = next(d for n, d in w.devices().items() if n != name)
    assert other["bindingConditions"] == ["FabricDeviceReady"]
    assert other["attributes"]["spare"] == {"bool": False}
    assert len(w.fabric.attached) == 1 and name in (spare_gpu1, taken_gpu0)
    # A restarted controller keeps it: no detach, no second attach.
    rec = Reconciler(w.api, w.fabric, rules)
    keep = rec.spares.reconcile

    def noted(*args: Any) -> Any:  # each of its passes wakes the wait below
        view = keep(*args)
        w.changed.changed()
        return view

    rec.spares.reconcile = noted  # type: ignore[method-assign,assignment]
    async with running(rec):
        await w.changed.until("the restart's pass", lambda: bool(rec.spares.last.keep), 10.0)
        async with asyncio.timeout(5.0):
            await rec.publisher.in_sync.wait()
    assert len(w.fabric.attached) == 1 and w.fabric.detached == []
    assert w.spares() == [name]


async def test_a_demand_spare_follows_an_allocation_and_leaves_when_idle() -> None:
    w = World(gpus=3)
    rules = settings(spares_demand="gpu:*=1", spares_idle_timeout=30, spares_cap=0.5)
    rec = Reconciler(w.api, w.fabric, rules)
    taken = variant_name("GPU-0", "node-a", "adapter0")
    claim = {
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": taken,
             "bindingConditions": ["FabricDeviceReady"]},
        ]}}},
    }  # fmt: skip
    with clock(rec) as now:
        async with running(rec):
            await w.changed.until("the pool", lambda: len(w.devices()) == 3)
            assert w.spares() == [] and w.fabric.attached == []  # no demand yet
            w.api.add(f"{RESOURCE_V1}/namespaces/default/resourceclaims", claim)
            await w.changed.until("a spare after the attach", lambda: len(w.spares()) == 1)
            (spare_dev,) = {a[0] for a in w.fabric.attached} - {"gpu-0"}  # gpu-0: the claim's
            now[0] += 31  # idle past the timeout
            rec.mark()
            await w.changed.until("the idle spare detached", lambda: w.fabric.detached != [])
            assert w.fabric.detached == [spare_dev] and w.spares() == []
            # Not replaced: the idle spare closed the node's demand window.
            assert len(w.fabric.attached) == 2 and rec.spares.last.attach == ()
