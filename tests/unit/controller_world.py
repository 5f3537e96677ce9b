"""A controller's world for unit tests: the shipped in-memory API and fabric,
and node-a's plugin reporting what is attached to it, with the reconciler's
settings and a running reconciler.

Why: the reconciler tests (warm spares, count-based managers, detaches)
drive the real reconciler over the same world; it lives here once, not in
one of those tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from driver.controller.process.settings import ControllerSettings
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import AttachResult, FabricDevice, HostAdapter
from driver.kube.api import slice_path
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


@asynccontextmanager
async def running(rec: Reconciler) -> AsyncIterator[None]:
    task = asyncio.create_task(rec.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
