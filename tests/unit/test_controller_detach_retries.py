"""A refused detach is asked again with backoff, and its Event names the connection.

Issue 33: a detach refused with ``409 connection 9 is still attaching`` was
asked again every second for as long as the connection was stuck. Now each
device's refusals back off (exponential, jittered, capped: client-go's
workqueue rate limiter per item), a pass during the wait asks nothing and
leaves the device free, a success resets it, and the DetachFailed Event
(one, counted as a series) carries the fabric's message naming the
connection in the way: from the in-memory fabric, and from the fabric
service through the real client in both dialects.

Time is a fake monotonic clock: no test waits out a backoff or measures one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.retries import Retries
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.events import ControllerEvents
from driver.errors import FabricConflict
from driver.fabricclient import FabricClient
from driver.fabricclient.dialect import DialectName
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.protocol import FabricApi
from driver.kube.events import EVENTS_V1, EventRecorder, ObjectRef
from driver.kube.memory import MemoryKube
from tests.unit.fabric_objects import GPU
from tests.unit.fabric_service import TOKEN, serving

NODE = ObjectRef("Node", "node-a", uid="uid-n")
STUCK = "connection 9 of gpu-0 is still attaching"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counted(MemoryFabric):
    def __init__(self) -> None:
        super().__init__([GPU])
        self.asked = 0

    async def detach(self, device_id: str) -> Any:
        self.asked += 1
        return await super().detach(device_id)


class Env:
    def __init__(self, fabric: FabricApi, retries: Retries) -> None:
        self.api, self.done, self.fabric = MemoryKube(), asyncio.Event(), fabric
        self.recorder = EventRecorder(self.api, "patchbay.dev/controller", "ctl-0")
        self.workers = Workers(
            fabric, ClaimStatusWriter(self.api, "fabric"), NodeReports(),
            FailedHolds(300.0, lambda: None), 60.0, self.done.set,
            ControllerEvents(self.recorder), retries=retries,
        )  # fmt: skip
        self.writer = asyncio.create_task(self.recorder.run())

    async def close(self) -> None:
        await self.workers.stop()
        self.writer.cancel()

    async def detach(self) -> None:
        """One pass that detaches gpu-0, on an inventory read after the last end."""
        self.workers.inventory_read(time.monotonic())
        self.workers.detach("gpu-0", NODE)
        assert self.workers.busy("gpu-0")
        await asyncio.wait_for(self.done.wait(), 30)  # a hang guard, not a timing
        self.done.clear()
        await self.recorder.drain()

    def events(self) -> list[dict[str, Any]]:
        return list(self.api.objects(f"{EVENTS_V1}/namespaces/default/events"))


@pytest.fixture
async def envs() -> AsyncIterator[list[Env]]:
    made: list[Env] = []
    yield made
    for env in made:
        await env.close()


async def test_a_refused_detach_backs_off_jittered_and_capped_then_resets(
    envs: list[Env],
) -> None:
    clock, fabric = Clock(), Counted()
    await fabric.attach("gpu-0", "node-a", "adapter0")
    fabric.fail("detach", FabricConflict(409, "ResourceInStandby", STUCK), times=6)
    retries = Retries(lambda: None, start=1.0, cap=8.0, jitter=0.5, clock=clock, rand=lambda: 0.5)
    env = Env(fabric, retries)
    envs.append(env)
    waits = []
    for refusal in range(1, 7):
        await env.detach()
        assert fabric.asked == refusal
        waits.append(retries.wait("gpu-0"))
        # A pass during the wait asks nothing, and leaves the device free.
        env.workers.inventory_read(time.monotonic())
        env.workers.detach("gpu-0", NODE)
        assert not env.workers.busy("gpu-0") and fabric.asked == refusal
        clock.now += waits[-1]
    # Doubling from 1 s, each stretched by the jitter (rand 0.5 of 50 %), capped at 8 s.
    assert waits == [1.25, 2.5, 5.0, 10.0, 10.0, 10.0]
    await env.detach()  # the fabric lets it go now
    assert fabric.asked == 7 and fabric.devices["gpu-0"].connection is None
    assert retries.due("gpu-0") and retries.wait("gpu-0") == 0
    failed = [e for e in env.events() if e["reason"] == "DetachFailed"]
    assert len(failed) == 1 and failed[0]["series"]["count"] == 6  # one Event, counted
    assert STUCK in failed[0]["note"] and failed[0]["type"] == "Warning"
    assert [e["reason"] for e in env.events()] == ["DetachFailed", "Detached"]


async def test_jitter_spreads_the_waits_and_success_starts_over() -> None:
    low = Retries(lambda: None, clock=Clock(), rand=lambda: 0.0)
    high = Retries(lambda: None, clock=Clock(), rand=lambda: 0.99)
    assert [low.refused("d") for _ in range(3)] == [1.0, 2.0, 4.0]
    assert [round(high.refused("d"), 3) for _ in range(3)] == [1.495, 2.99, 5.98]
    assert max(low.refused("d") for _ in range(20)) == 60.0  # the cap bounds every wait
    low.succeeded("d")
    assert low.due("d") and low.refused("d") == 1.0
    low.close()
    high.close()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[TestServer]:
    async with serving(tmp_path) as (_, server):
        yield server


@pytest.mark.parametrize("dialect", ["connections", "zones"])
async def test_the_detach_failed_event_names_the_connection_still_attaching(
    service: TestServer, dialect: DialectName, envs: list[Env]
) -> None:
    url = str(service.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as s:  # the attach is held: the connection attaches
        knobs = {"attachLatencySeconds": 3600}
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with s.post(url + "/patchbay/v1/faults", json=knobs, headers=auth) as r:
            assert r.status == 200
    async with FabricClient(url, TOKEN) as plain, FabricClient(url, TOKEN, dialect=dialect) as fc:
        await fc.attach("gpu-0", "node-a", "adapter0", key="claim")
        conn = (await plain.device("gpu-0")).connection  # the Connection, in either dialect
        assert conn is not None and conn.state == "Attaching"
        env = Env(fc, Retries(lambda: None, clock=Clock()))
        envs.append(env)
        await env.detach()
    (event,) = env.events()
    assert event["reason"] == "DetachFailed"
    assert f"connection {conn.id} of gpu-0 is still attaching" in event["note"]
