"""The event recorder (``driver.kube.events``) against the in-memory API:
the Event it writes, repeats folded into a series, the spam filter, and that
recording never blocks or fails its caller."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from driver.kube.events import EVENTS_V1, EventRecorder, ObjectRef
from driver.kube.memory import MemoryKube

CLAIM = ObjectRef("ResourceClaim", "c1", "ns", "uid-1", "resource.k8s.io/v1")
NODE = ObjectRef("Node", "node-a", uid="uid-n")
EVENTS = f"{EVENTS_V1}/namespaces/ns/events"
NODE_EVENTS = f"{EVENTS_V1}/namespaces/default/events"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.25

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> MemoryKube:
    return MemoryKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def recorder(api: MemoryKube, clock: Clock) -> AsyncIterator[EventRecorder]:
    # A burst the spam filter never reaches here (test_spam_filter_... tests it).
    rec = EventRecorder(
        api, "patchbay.dev/controller", "ctl-0", clock=clock, retry_s=0.01, burst=1000
    )
    task = asyncio.create_task(rec.run())
    yield rec
    task.cancel()


def events(api: MemoryKube, path: str = EVENTS) -> list[dict[str, Any]]:
    return api.objects(path)


async def test_an_event_is_an_events_v1_event_on_its_object(
    api: MemoryKube, recorder: EventRecorder
) -> None:
    recorder.warning(CLAIM, "AttachFailed", "Attach", "gpu-2: fabric says no")
    recorder.normal(NODE, "Attached", "Attach", "on a cluster-scoped object")
    await recorder.drain()
    (ev,) = events(api)
    assert ev["metadata"]["name"].startswith("c1.")
    assert {
        k: ev[k]
        for k in ("reportingController", "reportingInstance", "action", "reason", "note", "type")
    } == {
        "reportingController": "patchbay.dev/controller",
        "reportingInstance": "ctl-0",
        "action": "Attach",
        "reason": "AttachFailed",
        "note": "gpu-2: fabric says no",
        "type": "Warning",
    }
    assert ev["regarding"] == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c1",
        "namespace": "ns", "uid": "uid-1",
    }  # fmt: skip
    assert ev["eventTime"] == "2023-11-14T22:13:20.250000Z" and "series" not in ev
    (node_ev,) = events(api, NODE_EVENTS)  # cluster-scoped: namespace "default"
    assert node_ev["regarding"]["kind"] == "Node" and "namespace" not in node_ev["regarding"]


async def test_repeats_become_one_event_with_a_series(
    api: MemoryKube, recorder: EventRecorder, clock: Clock
) -> None:
    for _ in range(3):
        recorder.warning(CLAIM, "AttachFailed", "Attach", "same")
        await recorder.drain()
        clock.now += 1
    (ev,) = events(api)
    assert ev["series"]["count"] == 3
    assert ev["series"]["lastObservedTime"] == "2023-11-14T22:13:22.250000Z"
    assert ev["eventTime"] == "2023-11-14T22:13:20.250000Z"
    # A burst waiting in the queue is one write.
    writes = api.writes
    for _ in range(50):
        recorder.warning(CLAIM, "AttachFailed", "Attach", "same")
    await recorder.drain()
    assert api.writes == writes + 1
    assert events(api)[0]["series"]["count"] == 53
    # Another message is another Event; so is the same one after the series ended.
    recorder.warning(CLAIM, "AttachFailed", "Attach", "different")
    clock.now += 400
    recorder.warning(CLAIM, "AttachFailed", "Attach", "same")
    await recorder.drain()
    assert sorted((e["note"], (e.get("series") or {}).get("count", 1)) for e in events(api)) == [
        ("different", 1), ("same", 1), ("same", 53),
    ]  # fmt: skip


async def test_a_series_whose_event_expired_is_created_again(
    api: MemoryKube, recorder: EventRecorder
) -> None:
    recorder.normal(CLAIM, "Attached", "Attach", "x")
    await recorder.drain()
    (ev,) = events(api)
    await api.delete(f"{EVENTS}/{ev['metadata']['name']}")  # the apiserver's event TTL
    recorder.normal(CLAIM, "Attached", "Attach", "x")
    await recorder.drain()
    (again,) = events(api)
    assert again["metadata"]["name"] == ev["metadata"]["name"]
    assert again["series"]["count"] == 2


async def test_spam_filter_is_a_token_bucket_per_object(api: MemoryKube, clock: Clock) -> None:
    rec = EventRecorder(api, "patchbay.dev/plugin", "p", burst=3, refill_s=300, clock=clock)
    task = asyncio.create_task(rec.run())
    try:
        for i in range(5):
            rec.warning(CLAIM, "AttachFailed", "Attach", f"failure {i}")
        rec.warning(NODE, "FabricAdapterGone", "Watch", "another object has its own bucket")
        await rec.drain()
        assert sorted(e["note"] for e in events(api)) == ["failure 0", "failure 1", "failure 2"]
        assert len(events(api, NODE_EVENTS)) == 1 and rec.stats.dropped == 2
        # A repeat over the rate still counts; the count is written when its series ends.
        rec.warning(CLAIM, "AttachFailed", "Attach", "failure 0")
        await rec.drain()
        assert "series" not in next(e for e in events(api) if e["note"] == "failure 0")
        clock.now += 300  # one token back ...
        rec.warning(CLAIM, "AttachFailed", "Attach", "failure 5")
        await rec.drain()
        assert "failure 5" in {e["note"] for e in events(api)}
        clock.now += 400  # ... and the series of "failure 0" ended meanwhile
        rec.warning(NODE, "FabricAdapterGone", "Watch", "wakes the writer")
        await rec.drain()
        first = next(e for e in events(api) if e["note"] == "failure 0")
        assert first["series"]["count"] == 2
    finally:
        task.cancel()


async def test_refilled_buckets_are_forgotten_and_busy_ones_kept(
    api: MemoryKube, clock: Clock
) -> None:
    # A controller that runs for months must not keep a bucket per claim it
    # ever recorded on: a refilled bucket is what a new one would be.
    rec = EventRecorder(api, "patchbay.dev/controller", "c", burst=3, refill_s=300, clock=clock)
    task = asyncio.create_task(rec.run())
    try:
        claims = [ObjectRef("ResourceClaim", f"c{i}", "ns", f"u{i}") for i in range(10)]
        for ref in claims:
            rec.normal(ref, "Attached", "Attach", "once")
        for i in range(4):
            rec.warning(CLAIM, "AttachFailed", "Attach", f"busy {i}")  # 3 written, 1 dropped
        await rec.drain()
        assert len(rec._buckets) == 11
        clock.now += 301  # the claims' one token is back; CLAIM's bucket is at 1 of 3
        rec.normal(NODE, "Woken", "Watch", "wakes the writer")
        await rec.drain()
        assert set(rec._buckets) == {(CLAIM, "Warning"), (NODE, "Normal")}
        for i in range(4, 6):
            rec.warning(CLAIM, "AttachFailed", "Attach", f"busy {i}")
        await rec.drain()
        busy = {e["note"] for e in events(api) if e["note"].startswith("busy")}
        assert busy == {"busy 0", "busy 1", "busy 2", "busy 4"}, "still rate-limited"
    finally:
        task.cancel()


async def test_recording_never_blocks_or_raises(api: MemoryKube, clock: Clock) -> None:
    rec = EventRecorder(api, "patchbay.dev/plugin", "p", clock=clock, retry_s=0.01, max_queued=2)
    # Before the writer runs, events wait on a bounded queue; beyond it they are dropped.
    for i in range(3):
        rec.normal(NODE, "Queued", "Test", str(i))
    assert rec.stats.dropped == 1
    api.fail("POST", NODE_EVENTS, 500, times=2)  # transient: retried
    task = asyncio.create_task(rec.run())
    try:
        await rec.drain()
        assert sorted(e["note"] for e in events(api, NODE_EVENTS)) == ["0", "1"]
        api.fail("POST", NODE_EVENTS, 422)  # refused by the apiserver: not retried
        rec.warning(NODE, "Refused", "Test", "x")
        await rec.drain()
        assert rec.stats.failed == 1 and len(events(api, NODE_EVENTS)) == 2
        api.fail("POST", NODE_EVENTS, 503, times=3)  # down: given up after three tries
        rec.warning(NODE, "Lost", "Test", "y")
        await rec.drain()
        assert rec.stats.failed == 2
        # From another thread: hops onto the loop.
        thread = threading.Thread(target=rec.normal, args=(NODE, "FromThread", "Test", "z"))
        thread.start()
        thread.join()
        await asyncio.sleep(0)
        await rec.drain()
        assert "FromThread" in {e["reason"] for e in events(api, NODE_EVENTS)}
        assert not task.done()
    finally:
        task.cancel()


async def test_long_notes_and_names_fit_the_apiserver_limits(
    api: MemoryKube, recorder: EventRecorder
) -> None:
    long = ObjectRef("ResourceClaim", "c" * 253, "ns")
    recorder.warning(long, "AttachFailed", "Attach", "é" * 2000)
    await recorder.drain()
    (ev,) = events(api)
    assert len(ev["note"].encode()) <= 1024 and len(ev["metadata"]["name"]) <= 253


async def test_repeats_written_together_spend_one_token(api: MemoryKube, clock: Clock) -> None:
    rec = EventRecorder(api, "patchbay.dev/plugin", "p", burst=2, refill_s=300, clock=clock)
    for _ in range(50):  # queued before the writer runs: one write
        rec.warning(NODE, "DeviceUnhealthy", "HealthCheck", "same")
    task = asyncio.create_task(rec.run())
    try:
        await rec.drain()
        rec.warning(NODE, "DevicesNotPublished", "PublishSlices", "another")
        await rec.drain()
        stored = {e["reason"]: e for e in events(api, NODE_EVENTS)}
        assert set(stored) == {"DeviceUnhealthy", "DevicesNotPublished"}
        assert stored["DeviceUnhealthy"]["series"]["count"] == 50 and rec.stats.dropped == 0
    finally:
        task.cancel()
