"""The claim's status data names an attached GPU by the board serial its node
reports too (a count-based manager's only name for it), next to its UUID."""

from __future__ import annotations

import asyncio

from driver.controller import claims as cl
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.serials import serial_data
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.pool.variant import Variant
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import FabricDevice, HostAdapter
from driver.kube.api import RESOURCE_V1
from driver.kube.memory import MemoryKube

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"
VARIANT = Variant("fgpu-1", "gpu-0", "gpu", "GPU-0", "node-a", "adapter0", "pci0000:15")
ADAPTER = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
GPU = FabricDevice(
    "gpu-0", "pcie0", "sw0", "gpu", "H100-SXM5-80GB", "BRD1", "GPU-0", 0x10DE, 0x2330,
    "OK", True, False, (ADAPTER,), None,
)  # fmt: skip
RESULT = {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": "fgpu-1"}
CLAIM = {
    "metadata": {"name": "claim", "uid": "uid-1"},
    "status": {"allocation": {"devices": {"results": [RESULT]}}},
}


def test_serial_data_finds_the_gpus_serial_in_the_report() -> None:
    report = NodeFabric({"adapter0": "r"}, {"GPU-0": "adapter0"}, serials={"BRD1": "GPU-0"})
    assert serial_data(report, "gpu", "GPU-0") == {"serial": "BRD1"}
    assert serial_data(report, "gpu", "GPU-9") == {}
    assert serial_data(report, "nvme", "GPU-0") == {}  # a drive's identity is its serial
    assert serial_data(None, "gpu", "GPU-0") == {}


async def test_the_ready_claim_carries_uuid_and_serial() -> None:
    api, fabric, reports, done = MemoryKube(), MemoryFabric([GPU]), NodeReports(), asyncio.Event()
    api.add(CLAIMS, CLAIM)
    workers = Workers(
        fabric, ClaimStatusWriter(api, "fabric"), reports, FailedHolds(300.0, lambda: None),
        60.0, done.set,
    )  # fmt: skip
    seen = NodeFabric({"adapter0": "r"}, {"GPU-0": "adapter0"}, serials={"BRD1": "GPU-0"})
    node = {"metadata": {"name": "node-a", "annotations": {NODE_ANNOTATION: seen.to_annotation()}}}
    reports.refresh({"node-a": node})
    workers.attach(
        cl.FabricAllocation("uid-1", "default", "claim", "fgpu-1", False, False), VARIANT
    )
    async with asyncio.timeout(10):
        await done.wait()
    (entry,) = api.objects(CLAIMS)[0]["status"]["devices"]
    assert entry["data"] == {
        "fabricDevice": "gpu-0", "uuid": "GPU-0", "adapter": "adapter0", "serial": "BRD1",
    }  # fmt: skip
