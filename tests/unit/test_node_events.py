"""The node plugin's Events on its Node: a device turning unhealthy (health
monitor), devices left out of the pool over the apiserver's limits and a
slice the apiserver refused (slice publisher). Real monitor, publisher and
recorder on the shipped in-memory API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from driver.devices.model import Device
from driver.health.monitor import HealthMonitor
from driver.kube.api import slice_path
from driver.kube.events import EVENTS_V1, EventRecorder, ObjectEvents, ObjectRef
from driver.kube.memory import MemoryKube
from driver.slices.build import PoolSpec
from driver.slices.publisher import SlicePublisher

NODE = ObjectRef("Node", "node-a", uid="uid-n")
EVENTS = f"{EVENTS_V1}/namespaces/default/events"
GPU0 = Device("gpu-0", "gpu", "GPU-aaaa")
MIG = Device("gpu-0-mig-1g", "mig", "MIG-1", {"profile": "1g.10gb"}, parent="GPU-aaaa")


class Env:
    def __init__(self) -> None:
        self.api = MemoryKube()
        self.recorder = EventRecorder(self.api, "patchbay.dev/plugin", "patchbay-plugin-node-a")
        self.events = ObjectEvents(self.recorder, NODE)

    def stored(self) -> list[dict[str, Any]]:
        return self.api.objects(EVENTS)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    task = asyncio.create_task(e.recorder.run())
    yield e
    task.cancel()


async def test_a_gpu_turning_unhealthy_is_a_warning_on_the_node(env: Env) -> None:
    monitor = HealthMonitor()
    monitor.bind_loop()
    monitor.events = env.events
    monitor.set_devices({"node-a": [GPU0, MIG, Device("gpu-1", "gpu", "GPU-bbbb")]})
    monitor.report_xid("GPU-aaaa", 13)  # an application error: no Event
    await env.recorder.drain()
    assert env.stored() == []
    monitor.report_xid("GPU-aaaa", 79)
    monitor.report_xid("GPU-aaaa", 79)  # already unhealthy: nothing new
    await env.recorder.drain()
    (ev,) = env.stored()
    assert ev["regarding"]["kind"] == "Node" and ev["regarding"]["uid"] == "uid-n"
    assert (ev["type"], ev["reason"], ev["action"]) == ("Warning", "DeviceUnhealthy", "HealthCheck")
    assert ev["note"] == (
        "GPU GPU-aaaa reported critical XID 79 (replace class): gpu-0, gpu-0-mig-1g unhealthy, "
        "published with a NoExecute taint (patchbay.dev/unhealthy)"
    )
    assert "series" not in ev


def pool(*devices: Device) -> PoolSpec:
    return PoolSpec("patchbay.dev", "node-a", "node-a-patchbay", {"nodeName": "node-a"}, devices)


async def test_devices_over_a_limit_and_refused_slices_are_warnings(env: Env) -> None:
    publisher = SlicePublisher(env.api, {}, "node-a")
    publisher.events = env.events
    too_long = Device("gpu-1", "gpu", "GPU-1", {"productName": "x" * 65})
    publisher.set_pool(pool(GPU0, too_long))
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.wait_for(publisher.in_sync.wait(), 5)
        await env.recorder.drain()
        (ev,) = env.stored()
        assert (ev["type"], ev["reason"]) == ("Warning", "DevicesNotPublished")
        assert ev["note"].startswith("1 device(s) left out of pool node-a (limits the apiserver")
        assert "gpu-1: attribute 'productName': string longer than 64" in ev["note"]
        # The apiserver refuses the next write (422): the publisher retries, the Node says why.
        env.api.fail("PUT", slice_path("node-a-patchbay-0"), 422)
        publisher.set_pool(pool(GPU0, Device("gpu-2", "gpu", "GPU-2")))
        await asyncio.wait_for(publisher.in_sync.wait(), 5)
        await env.recorder.drain()
        refused = [e for e in env.stored() if e["reason"] == "SlicePublishFailed"]
        assert len(refused) == 1 and "HTTP 422" in refused[0]["note"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
