"""The slice publisher backs off when the apiserver does not keep what it writes.

A field the apiserver drops (``taints`` with ``DRADeviceTaints`` off, for
instance) makes every stored slice differ from the desired one again; before
the guard that meant a rewrite per watch event, hundreds a second.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from driver.devices.model import Device, DeviceTaint
from driver.kube.memory import MemoryKube
from driver.slices import publisher as publisher_module
from driver.slices.build import DesiredSlice, PoolSpec, build_slices
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


async def test_a_dropped_field_does_not_make_a_hot_write_loop() -> None:
    api = dropping_api()
    publisher = SlicePublisher(api, {}, "node-a")
    taint = DeviceTaint("patchbay.dev/unhealthy", "xid-48", "NoSchedule", "2026-11-30T07:00:00Z")
    device = Device("gpu-0", "gpu", "GPU-0", taints=(taint,))
    spec = PoolSpec("patchbay.dev", "node-a", "node-a-patchbay", {"nodeName": "node-a"}, (device,))
    publisher.set_pool(spec)
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.sleep(1.5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 2 <= api.writes <= 5, api.writes


async def test_the_same_pool_again_is_neither_rebuilt_nor_rediffed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = MemoryKube()
    builds: list[PoolSpec] = []
    real_build = build_slices

    def build(pool: PoolSpec) -> list[DesiredSlice]:
        builds.append(pool)
        return real_build(pool)

    monkeypatch.setattr(publisher_module, "build_slices", build)
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
        await asyncio.sleep(0.2)  # the write's watch echo arrives meanwhile
        assert publisher.in_sync.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert api.writes == 1
    assert len(builds) == 1, "one build for the pool, none per equal set_pool or watch event"
