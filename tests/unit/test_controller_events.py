"""The controller's Events: on the claim for attach started, attached,
attach failed (with the fabric's message) and detached; on the Node for a
fabric adapter gone. Real workers, status writer and recorder on the
shipped in-memory API and fabric (as in test_controller_workers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.events import ControllerEvents, gone_adapters, node_ref
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.memory import MemoryFabric
from driver.kube.api import RESOURCE_V1
from driver.kube.events import EVENTS_V1, EventRecorder, ObjectRef
from driver.kube.memory import MemoryKube
from tests.unit.fabric_objects import ALLOC, CLAIM, GPU, VARIANT, node


class Env:
    def __init__(self, timeout: float) -> None:
        self.api, self.fabric = MemoryKube(), MemoryFabric([GPU], instant=False)
        self.api.add(f"{RESOURCE_V1}/namespaces/default/resourceclaims", CLAIM)
        self.reports, self.done = NodeReports(), asyncio.Event()
        self.recorder = EventRecorder(self.api, "patchbay.dev/controller", "ctl-0")
        self.workers = Workers(
            self.fabric, ClaimStatusWriter(self.api, "fabric"), self.reports,
            FailedHolds(300.0, lambda: None), timeout, self.done.set,
            ControllerEvents(self.recorder),
        )  # fmt: skip

    async def ended(self) -> None:
        await asyncio.wait_for(self.done.wait(), 10)
        self.done.clear()
        await self.recorder.drain()

    def events(self, namespace: str = "default") -> list[tuple[str, str, str, str]]:
        return [
            (e["regarding"]["kind"], e["regarding"]["name"], e["reason"], e["note"])
            for e in sorted(
                self.api.objects(f"{EVENTS_V1}/namespaces/{namespace}/events"),
                key=lambda e: int(e["metadata"]["resourceVersion"]),
            )
        ]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env(timeout=60.0)
    task = asyncio.create_task(e.recorder.run())
    yield e
    task.cancel()


async def test_attach_and_detach_are_events_on_the_claim(env: Env) -> None:
    env.reports.refresh({"node-a": node({"GPU-0": "adapter0"})})
    env.workers.attach(ALLOC, VARIANT)
    for _ in range(20):
        await asyncio.sleep(0)
    await env.recorder.drain()
    # Attach started: visible while the fabric still works on it.
    note = "attaching fabric device gpu-0 to node node-a via adapter0"
    assert env.events() == [("ResourceClaim", "claim", "Attaching", note)]
    env.fabric.finish(next(iter(env.fabric.tasks)))
    await env.ended()
    assert env.events()[1:] == [
        ("ResourceClaim", "claim", "Attached", "gpu-0 attached to node-a via adapter0")
    ]
    stored = env.api.objects(f"{EVENTS_V1}/namespaces/default/events")[0]
    assert stored["regarding"]["uid"] == "uid-1" and stored["type"] == "Normal"
    # The pass that detaches reads an inventory requested after the attach ended.
    env.workers.inventory_read(time.monotonic())
    env.workers.detach("gpu-0", ObjectRef("Node", "node-a"))
    await env.ended()
    assert env.events()[2:] == [
        ("ResourceClaim", "claim", "Detached", "fabric device gpu-0 detached from node node-a")
    ]


async def test_a_failed_attach_is_a_warning_with_the_fabrics_message(env: Env) -> None:
    env.reports.refresh({"node-a": node({})})
    env.workers.attach(ALLOC, VARIANT)
    for _ in range(20):
        await asyncio.sleep(0)
    env.fabric.finish(next(iter(env.fabric.tasks)), ok=False, message="slot 3: link training")
    await env.ended()
    kind, name, reason, note = env.events()[-1]
    assert (kind, name, reason) == ("ResourceClaim", "claim", "AttachFailed")
    assert note == (
        "attaching gpu-0 to node-a via adapter0 failed: slot 3: link training; gpu-0 is held "
        "out of the pool for 300s"
    )
    warning = env.api.objects(f"{EVENTS_V1}/namespaces/default/events")[-1]
    assert warning["type"] == "Warning" and warning["action"] == "Attach"


async def test_a_detach_nobody_attached_here_is_an_event_on_the_node(env: Env) -> None:
    # A previous incarnation attached it: the claim is not known, the Node is.
    env.fabric.instant = True
    await env.fabric.attach("gpu-0", "node-a", "adapter0")
    nodes: dict[str, Any] = {"node-a": {"metadata": {"name": "node-a", "uid": "uid-n"}}}
    env.workers.detach("gpu-0", node_ref(nodes, "node-a"))
    await env.ended()
    (ev,) = env.api.objects(f"{EVENTS_V1}/namespaces/default/events")
    assert ev["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a",
                               "uid": "uid-n"}  # fmt: skip
    assert ev["reason"] == "Detached"


def test_gone_adapters_from_the_report_or_the_fabric() -> None:
    two = NodeFabric({"adapter0": "pci0000:15", "adapter1": "pci0000:85"})
    one = NodeFabric({"adapter0": "pci0000:15"})
    listed = {("node-a", "adapter0"), ("node-a", "adapter1"), ("node-b", "adapter0")}
    nodes: dict[str, Any] = {"node-a": {}, "node-b": {}}
    assert gone_adapters({"node-a": two}, listed, {"node-a": two}, listed, nodes) == []
    assert gone_adapters({"node-a": two}, listed, {"node-a": one}, listed, nodes) == [
        ("node-a", "adapter1", "the node reports adapter adapter1 (pci0000:85) no more")
    ]
    fewer = listed - {("node-b", "adapter0")}
    assert gone_adapters({}, listed, {}, fewer, nodes) == [
        ("node-b", "adapter0", "the fabric no longer lists adapter adapter0")
    ]
    # A Node that is gone altogether has nothing to record an Event on.
    assert gone_adapters({"node-a": two}, listed, {}, set(), {}) == []
