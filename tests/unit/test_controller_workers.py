"""The attach workers, with their collaborators and without a reconciler.

An attach ends when the node's report shows the device behind the adapter:
the report's change signal wakes the worker (no polling of the Node
cache). An attach the node never confirms ends in ``FabricAttachFailed``
and a hold on the device. In-memory doubles of the fabric and the status
writer; the node reports, holds and workers are the real ones.
"""

from __future__ import annotations

import asyncio
from typing import Any

from driver.controller import claims as cl
from driver.controller.holds import FailedHolds
from driver.controller.pool import Variant
from driver.controller.reports import NodeReports
from driver.controller.workers import Workers
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    NODE_ANNOTATION,
    READY_CONDITION,
    NodeFabric,
)
from driver.fabricclient.model import AttachResult

VARIANT = Variant("fgpu-1", "gpu-0", "gpu", "GPU-0", "node-a", "adapter0", "pci0000:15")
ALLOC = cl.FabricAllocation("uid-1", "default", "claim", "fgpu-1", ready=False, failed=False)


class Fabric:
    def __init__(self) -> None:
        self.attached: list[tuple[str, str, str]] = []

    async def attach(self, device_id: str, node: str, adapter: str) -> AttachResult:
        self.attached.append((device_id, node, adapter))
        return AttachResult("/connections/1", None)


class Status:
    def __init__(self) -> None:
        self.written: list[str] = []

    async def write(
        self, a: cl.FabricAllocation, cond: dict[str, Any], data: dict[str, Any] | None
    ) -> bool:
        self.written.append(cond["type"])
        return True


def node(gpus: dict[str, str]) -> dict[str, Any]:
    report = NodeFabric({"adapter0": "pci0000:15"}, gpus=gpus).to_annotation()
    return {"metadata": {"name": "node-a", "annotations": {NODE_ANNOTATION: report}}}


def workers(
    timeout: float,
) -> tuple[Workers, Fabric, Status, NodeReports, FailedHolds, asyncio.Event]:
    fabric, status, reports, done = Fabric(), Status(), NodeReports(), asyncio.Event()
    holds = FailedHolds(300.0, lambda: None)
    w = Workers(fabric, status, reports, holds, timeout, done.set)  # type: ignore[arg-type]
    return w, fabric, status, reports, holds, done


async def test_attach_is_ready_once_the_node_report_shows_the_device() -> None:
    w, fabric, status, reports, holds, done = workers(timeout=60.0)
    reports.refresh({"node-a": node({})})
    w.attach(ALLOC, VARIANT)
    for _ in range(20):  # the worker runs, attaches, and waits for the node
        await asyncio.sleep(0)
    assert fabric.attached == [("gpu-0", "node-a", "adapter0")]
    assert w.busy("gpu-0") and status.written == []
    reports.refresh({"node-a": node({"GPU-0": "adapter1"})})  # behind another adapter
    for _ in range(20):
        await asyncio.sleep(0)
    assert w.busy("gpu-0") and status.written == []
    reports.refresh({"node-a": node({"GPU-0": "adapter0"})})
    await asyncio.wait_for(done.wait(), 10)
    assert status.written == [READY_CONDITION]
    assert "gpu-0" not in holds and not w.busy("gpu-0")


async def test_attach_the_node_never_reports_fails_and_holds_the_device() -> None:
    w, _, status, reports, holds, done = workers(timeout=0.2)
    reports.refresh({"node-a": node({})})
    w.attach(ALLOC, VARIANT)
    await asyncio.wait_for(done.wait(), 10)
    assert status.written == [FAILED_CONDITION]
    assert "gpu-0" in holds and holds.held() == {"gpu-0"}


async def test_a_held_device_is_refused_without_asking_the_fabric() -> None:
    w, fabric, status, _, holds, done = workers(timeout=60.0)
    holds.hold("gpu-0")
    w.attach(ALLOC, VARIANT)
    await asyncio.wait_for(done.wait(), 10)
    assert fabric.attached == [] and status.written == [FAILED_CONDITION]


async def test_reports_wake_only_on_a_change() -> None:
    reports = NodeReports()
    first = reports.refresh({"node-a": node({"GPU-0": "adapter0"})})
    assert reports.sees("node-a", "gpu", "GPU-0", "adapter0")
    assert first == {"node-a": reports.get("node-a")}
    waiter = asyncio.ensure_future(
        reports.wait_until(lambda: reports.get("node-b") is not None, deadline=1e18)
    )
    await asyncio.sleep(0)
    reports.refresh({"node-a": node({"GPU-0": "adapter0"})})  # same reports: no wake-up
    await asyncio.sleep(0)
    assert not waiter.done()
    reports.refresh({"node-a": node({}), "node-b": node({})})
    assert await asyncio.wait_for(waiter, 10)
