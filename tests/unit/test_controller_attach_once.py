"""Each allocation costs the fabric one attach request.

A pass that runs before the controller's own status write is in its claims
cache still sees the allocation waiting; a restarted controller sees it
waiting with an attach already under way on the fabric. Neither may ask the
fabric again: against a count-based manager a second request is a second
device. The fabric double counts every attach request it receives, whatever
it answers.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from driver.controller import claims as cl
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.fabric_devices.naming import NODE_ANNOTATION, READY_CONDITION, NodeFabric
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import AttachResult
from driver.kube.api import RESOURCE_V1
from driver.kube.memory import MemoryKube
from tests.unit.fabric_objects import ALLOC, CLAIM, GPU, VARIANT

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"


class CountingFabric(MemoryFabric):
    """The shipped in-memory fabric, counting attach requests as a fabric
    manager's audit log would (an answer of "already attached" counts too)."""

    def __init__(self, *, instant: bool) -> None:
        super().__init__([GPU], instant=instant)
        self.requests = 0

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        self.requests += 1
        assert key == "uid-1"  # the allocation's own Idempotency-Key
        return await super().attach(device_id, node, adapter, key)


class Controller:
    """One controller incarnation's workers over a shared fabric and API."""

    def __init__(self, api: MemoryKube, fabric: CountingFabric) -> None:
        self.api, self.done = api, asyncio.Event()
        reports = NodeReports()
        report = NodeFabric({"adapter0": "pci0000:15"}, gpus={"GPU-0": "adapter0"})
        reports.refresh({"node-a": {"metadata": {"name": "node-a", "annotations": {
            NODE_ANNOTATION: report.to_annotation()}}}})  # fmt: skip
        status = ClaimStatusWriter(api, "fabric")
        holds = FailedHolds(300.0, lambda: None)
        self.workers = Workers(fabric, status, reports, holds, 60.0, self.done.set)

    def allocation(self) -> cl.FabricAllocation:
        """The allocation as a fresh claims cache would show it now."""
        [a] = cl.fabric_allocations(self.claim(), "fabric")
        return a

    def claim(self) -> dict[str, Any]:
        claim: dict[str, Any] = self.api.objects(CLAIMS)[0]
        return claim

    async def settle(self) -> None:
        await asyncio.wait_for(self.done.wait(), 10)
        self.done.clear()


def world(*, instant: bool) -> tuple[MemoryKube, CountingFabric]:
    api = MemoryKube()
    api.add(CLAIMS, CLAIM)
    return api, CountingFabric(instant=instant)


async def test_a_pass_on_a_stale_cache_does_not_ask_again() -> None:
    api, fabric = world(instant=True)
    ctl = Controller(api, fabric)
    ctl.workers.attach(ALLOC, VARIANT)
    await ctl.settle()
    assert ctl.allocation().ready and fabric.requests == 1
    # The pass the attach's end triggers: the cache has not seen the write yet.
    assert ALLOC.ready is False
    ctl.workers.attach(ALLOC, VARIANT)
    assert not ctl.workers.busy(VARIANT.device_id) and ctl.workers.settled(ALLOC)
    assert fabric.requests == 1
    # Once the cache shows the outcome, the memory of it goes.
    ctl.workers.forget(set())
    assert not ctl.workers.settled(ALLOC)


async def test_the_operation_handle_is_on_the_claim_while_the_attach_runs() -> None:
    api, fabric = world(instant=False)
    ctl = Controller(api, fabric)
    ctl.workers.attach(ALLOC, VARIANT)
    for _ in range(50):
        await asyncio.sleep(0)
        if ctl.allocation().operation:
            break
    [task_uri] = fabric.tasks
    entry = ctl.claim()["status"]["devices"][0]
    assert entry["data"] == {cl.OPERATION_KEY: task_uri}
    assert [(c["type"], c["status"], c["reason"]) for c in entry["conditions"]] == [
        (READY_CONDITION, "False", "Attaching")
    ]
    fabric.finish(task_uri)
    await ctl.settle()
    a = ctl.allocation()
    assert a.ready and not a.operation and fabric.requests == 1


async def test_a_restart_resumes_the_recorded_operation() -> None:
    api, fabric = world(instant=False)
    first = Controller(api, fabric)
    first.workers.attach(ALLOC, VARIANT)
    for _ in range(50):
        await asyncio.sleep(0)
        if first.allocation().operation:
            break
    first.workers.cancel_unneeded(set())  # the process dies while the task runs
    a = first.allocation()
    assert a.operation and not a.ready
    second = Controller(api, fabric)
    second.workers.attach(a, VARIANT)
    await asyncio.sleep(0)
    fabric.finish(a.operation)
    await second.settle()
    assert second.allocation().ready and fabric.requests == 1


async def test_a_restart_adopts_an_attach_it_has_no_handle_for() -> None:
    """Killed right after the fabric answered: no handle on the claim, but
    the fabric shows the connection on its way to this node and adapter."""
    api, fabric = world(instant=False)
    await fabric.attach(VARIANT.device_id, VARIANT.node, VARIANT.adapter, "uid-1")
    ctl = Controller(api, fabric)
    ctl.workers.attach(ALLOC, VARIANT)
    await asyncio.sleep(0)
    [task_uri] = fabric.tasks
    fabric.finish(task_uri)
    await ctl.settle()
    assert ctl.allocation().ready and fabric.requests == 1


async def test_a_gone_handle_falls_back_to_the_device_state() -> None:
    api, fabric = world(instant=True)
    await fabric.attach(VARIANT.device_id, VARIANT.node, VARIANT.adapter, "uid-1")  # long done
    ctl = Controller(api, fabric)
    ctl.workers.attach(replace(ALLOC, operation="/redfish/v1/TaskService/TaskMonitors/9"), VARIANT)
    await ctl.settle()
    assert ctl.allocation().ready and fabric.requests == 1
