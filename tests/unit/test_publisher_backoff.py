"""The slice publisher backs off when the apiserver does not keep what it writes.

A field the apiserver drops (``taints`` with ``DRADeviceTaints`` off, for
instance) makes every stored slice differ from the desired one again; before
the guard that meant a rewrite per watch event, hundreds a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from driver.devices.model import Device, DeviceTaint
from driver.kube.memory import MemoryKube
from driver.slices import publisher as publisher_module
from driver.slices.build import DesiredSlice, PoolSpec, build_slices
from driver.slices.diff import PoolDiff, diff_pool
from driver.slices.publisher import SlicePublisher


def dropping_api() -> MemoryKube:
    """The shipped in-memory API, storing slices without their devices' taints
    (as an apiserver with the DRADeviceTaints gate off does)."""
    api = MemoryKube()

    def drop_taints(path: str, obj: dict[str, Any]) -> None:
        for d in obj.get("spec", {}).get("devices") or ():
            d.pop("taints", None)

    api.on_store = drop_taints
    return api


class HeldSleeper:
    """The publisher's back-off wait, held until the test lets it end: records
    each delay asked for and how many writes the apiserver had stored then."""

    def __init__(self, api: MemoryKube) -> None:
        self._api = api
        self.waits: list[tuple[float, int]] = []  # (delay, writes so far)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.waits.append((delay, self._api.writes))
        self.asked.set()
        await self.release.wait()
        self.release.clear()

    async def next_wait(self) -> tuple[float, int]:
        async with asyncio.timeout(5):
            await self.asked.wait()
        self.asked.clear()
        return self.waits[-1]


async def test_a_dropped_field_does_not_make_a_hot_write_loop() -> None:
    api = dropping_api()
    sleeper = HeldSleeper(api)
    publisher = SlicePublisher(api, {}, "node-a", sleep=sleeper, rand=lambda: 0.5)
    taint = DeviceTaint("patchbay.dev/unhealthy", "xid-48", "NoSchedule", "2026-11-30T07:00:00Z")
    device = Device("gpu-0", "gpu", "GPU-0", taints=(taint,))
    spec = PoolSpec("patchbay.dev", "node-a", "node-a-patchbay", {"nodeName": "node-a"}, (device,))
    publisher.set_pool(spec)
    task = asyncio.create_task(publisher.run())
    try:
        # The first write and REWRITES_BEFORE_BACKOFF - 1 rewrites, each on the
        # watch echo of the one before; then a wait before every further write,
        # doubling, jittered (rand 0.5: half the jitter), and exactly one write
        # after each wait.
        more = 1 + 0.5 * publisher_module.BACKOFF_JITTER
        assert more > 1
        assert await sleeper.next_wait() == (2.0**3 * more, 3)
        sleeper.release.set()
        assert await sleeper.next_wait() == (2.0**4 * more, 4)
        sleeper.release.set()
        assert await sleeper.next_wait() == (2.0**5 * more, 5)
        assert api.writes == 5  # held: the echoes of write 5 wrote nothing
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class EchoCountingKube(MemoryKube):
    """The shipped in-memory API, counting the watch events it has handed out."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered = 0

    async def watch(
        self, path: str, query: Mapping[str, Any], timeout_seconds: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        async for event in super().watch(path, query, timeout_seconds):
            self.delivered += 1
            yield event


async def test_the_same_pool_again_is_neither_rebuilt_nor_rediffed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = EchoCountingKube()
    builds: list[PoolSpec] = []
    real_build, real_diff = build_slices, diff_pool
    diffed_after_echo = asyncio.Event()

    def build(pool: PoolSpec) -> list[DesiredSlice]:
        builds.append(pool)
        return real_build(pool)

    def diff(*args: Any) -> PoolDiff:
        if api.delivered:  # the echo is in the publisher's cache: this pass reacts to it
            diffed_after_echo.set()
        return real_diff(*args)

    monkeypatch.setattr(publisher_module, "build_slices", build)
    monkeypatch.setattr(publisher_module, "diff_pool", diff)
    publisher = SlicePublisher(api, {}, "node-a")
    device = Device("gpu-0", "gpu", "GPU-0")

    def pool() -> PoolSpec:  # a fresh but equal spec, as each rescan makes
        return PoolSpec("patchbay.dev", "node-a", "node-a-patchbay", {"nodeName": "node-a"},
                        (device,))  # fmt: skip

    publisher.set_pool(pool())
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.wait_for(publisher.in_sync.wait(), 5)
        for _ in range(3):
            publisher.set_pool(pool())
        async with asyncio.timeout(5):  # the pass that the write's watch echo wakes
            await diffed_after_echo.wait()
        assert api.delivered == 1 and publisher.in_sync.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert api.writes == 1
    assert len(builds) == 1, "one build for the pool, none per equal set_pool or watch event"
