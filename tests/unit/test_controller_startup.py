"""The controller's first pass starts on its own, whichever input is ready last.

The reconciler waits for its claim and Node caches, the stored fabric pool
slices and the fabric inventory; each of them must wake it once ready,
because nothing else will for ``--fabric-refresh`` seconds. In-memory
doubles of the API and the fabric; the pool published is the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from driver.controller.reconciler import Reconciler
from driver.controller.settings import ControllerSettings
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricDevice, FabricInventory, HostAdapter

NODE = {
    "metadata": {
        "name": "node-a",
        "annotations": {
            "patchbay.dev/fabric": NodeFabric({"adapter0": "pci0000:15"}).to_annotation()
        },
    }
}


class SlowApi:
    """Lists answer at once, except the kinds held back until released."""

    def __init__(self, held: set[str]) -> None:
        self.release = {k: asyncio.Event() for k in held}
        self.created: list[dict[str, Any]] = []

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> dict[str, Any]:
        kind = path.rsplit("/", 1)[-1]
        if kind in self.release:
            await self.release[kind].wait()
        items = [NODE] if kind == "nodes" else []
        return {"items": items, "metadata": {"resourceVersion": "1"}}

    async def watch(self, path: str, query: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()  # no events
        yield {}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body)
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}}


class QuietFabric:
    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def inventory(self) -> FabricInventory:
        await self.released.wait()
        adapter = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
        gpu = FabricDevice(
            "gpu-0", "pcie0", "sw0", "gpu", "H100-SXM5-80GB", "S1", "GPU-0", 0x10DE, 0x2330,
            "OK", True, False, (adapter,), None,
        )  # fmt: skip
        return FabricInventory((gpu,), (adapter,))

    async def events(self) -> AsyncIterator[list[str]]:
        yield []
        await asyncio.Event().wait()


@pytest.mark.parametrize("last", ["resourceslices", "resourceclaims", "nodes", "fabric"])
async def test_first_pass_publishes_whichever_input_is_ready_last(last: str) -> None:
    api = SlowApi({"resourceslices", "resourceclaims", "nodes"})
    fabric = QuietFabric()
    settings = ControllerSettings(fabric_url="http://fabric", fabric_token="t", fabric_refresh=300)
    rec = Reconciler(api, fabric, settings)  # type: ignore[arg-type]
    task = asyncio.create_task(rec.run())
    try:
        await asyncio.sleep(0.05)
        for kind, event in [*api.release.items(), ("fabric", fabric.released)]:
            if kind != last:
                event.set()
        await asyncio.sleep(0.1)  # every other input is in: still nothing published
        assert api.created == []
        (api.release.get(last) or fabric.released).set()
        for _ in range(100):
            if api.created:
                break
            await asyncio.sleep(0.02)
        devices = [d["name"] for s in api.created for d in s["spec"].get("devices") or ()]
        assert len(devices) == 1 and devices[0].startswith("fgpu-")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
