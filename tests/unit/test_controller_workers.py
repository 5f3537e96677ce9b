"""The attach workers, with their collaborators and without a reconciler.

An attach ends when the node's report shows the device behind the adapter:
the report's change signal wakes the worker (no polling of the Node
cache). An attach the node never confirms ends in ``FabricDeviceFailed``
and a hold on the device. In-memory doubles of the fabric and the status
writer; the node reports, holds and workers are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses

from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    LEGACY_FAILED_CONDITION,
    READY_CONDITION,
)
from driver.fabricclient.memory import MemoryFabric
from driver.kube.api import RESOURCE_V1
from driver.kube.memory import MemoryKube
from tests.unit.fabric_objects import ALLOC, CLAIM, GPU, VARIANT, node


class Node:
    """The controller's collaborators: the shipped in-memory fabric and API
    (the claim lives there; the real status writer sets its conditions)."""

    def __init__(self, timeout: float) -> None:
        self.api, self.fabric = MemoryKube(), MemoryFabric([GPU])
        self.api.add(f"{RESOURCE_V1}/namespaces/default/resourceclaims", CLAIM)
        self.reports, self.done = NodeReports(), asyncio.Event()
        self.holds = FailedHolds(300.0, lambda: None)
        status = ClaimStatusWriter(self.api, "fabric")
        self.workers = Workers(self.fabric, status, self.reports, self.holds, timeout,
                               self.done.set)  # fmt: skip

    def conditions(self) -> list[str]:
        claim = self.api.objects(f"{RESOURCE_V1}/namespaces/default/resourceclaims")[0]
        entries = (claim.get("status") or {}).get("devices") or []
        return [c["type"] for e in entries for c in e.get("conditions") or []]


async def test_attach_is_ready_once_the_node_report_shows_the_device() -> None:
    n = Node(timeout=60.0)
    n.reports.refresh({"node-a": node({})})
    n.workers.attach(ALLOC, VARIANT)
    for _ in range(20):  # the worker runs, attaches, and waits for the node
        await asyncio.sleep(0)
    assert n.fabric.attached == [("gpu-0", "node-a", "adapter0")]
    assert n.workers.busy("gpu-0") and n.conditions() == []
    n.reports.refresh({"node-a": node({"GPU-0": "adapter1"})})  # behind another adapter
    for _ in range(20):
        await asyncio.sleep(0)
    assert n.workers.busy("gpu-0") and n.conditions() == []
    n.reports.refresh({"node-a": node({"GPU-0": "adapter0"})})
    await asyncio.wait_for(n.done.wait(), 10)
    assert n.conditions() == [READY_CONDITION]
    assert "gpu-0" not in n.holds and not n.workers.busy("gpu-0")


async def test_attach_the_node_never_reports_fails_and_holds_the_device() -> None:
    n = Node(timeout=0.2)
    n.reports.refresh({"node-a": node({})})
    n.workers.attach(ALLOC, VARIANT)
    await asyncio.wait_for(n.done.wait(), 10)
    assert n.conditions() == [FAILED_CONDITION]
    assert "gpu-0" in n.holds and n.holds.held() == {"gpu-0"}


async def test_a_failure_sets_the_condition_its_allocation_lists() -> None:
    """An allocation made before the rename (upgrades, docs/fabric.md) fails
    with the legacy name: the scheduler watches only what its result lists."""
    n = Node(timeout=60.0)
    n.holds.hold("gpu-0")
    n.workers.attach(dataclasses.replace(ALLOC, failure_condition=LEGACY_FAILED_CONDITION), VARIANT)
    async with asyncio.timeout(10):
        await n.done.wait()
    assert n.conditions() == [LEGACY_FAILED_CONDITION]


async def test_a_held_device_is_refused_without_asking_the_fabric() -> None:
    n = Node(timeout=60.0)
    n.holds.hold("gpu-0")
    n.workers.attach(ALLOC, VARIANT)
    await asyncio.wait_for(n.done.wait(), 10)
    assert n.fabric.attached == [] and n.conditions() == [FAILED_CONDITION]


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
