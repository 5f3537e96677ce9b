"""The hot-plug watch never ends quietly: a source that fails (even in the
middle of a burst) or simply ends makes it raise, so the plugin's task group
goes down, and /healthz turns red from that moment."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from driver.errors import HotplugError
from driver.kube.api import KubeApi
from driver.node.hotplug import watch
from plugin.app import NodePlugin
from plugin.settings import PluginSettings
from tests.signals import LogSignal

DEBOUNCE = 0.2


@dataclass(frozen=True)
class Event:
    action: str
    device_path: str = "/devices/pci0000:85/0000:85:01.0/0000:86:00.0"


class Rescans:
    def __init__(self) -> None:
        self.count = 0
        self.called = asyncio.Event()

    async def __call__(self) -> None:
        self.count += 1
        self.called.set()


async def test_a_burst_is_one_rescan() -> None:
    release = threading.Event()

    def source() -> Iterator[Event]:
        yield Event("add")
        yield Event("bind")
        yield Event("add")
        release.wait(10)  # then stays open, like the kernel's stream

    rescan = Rescans()
    with LogSignal.on("driver.node.hotplug") as lines:
        task = asyncio.create_task(watch(source(), rescan, debounce_s=DEBOUNCE))
        line = await lines.until_logged("re-enumerating")
    # The first rescan took the whole burst: no event is left for a second one.
    assert line == "hot-plug: add 0000:86:00.0, add 0000:86:00.0; re-enumerating"  # bind: no rescan
    assert rescan.count == 1 and not task.done()
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_source_failing_during_a_debounce_window_ends_the_watch() -> None:
    def source() -> Iterator[Event]:
        yield Event("add")
        raise OSError("netlink socket closed")  # while the loop waits out the burst

    with pytest.raises(HotplugError, match="netlink socket closed") as info:
        await asyncio.wait_for(watch(source(), Rescans(), debounce_s=DEBOUNCE), 5)
    assert isinstance(info.value.__cause__, OSError)


async def test_source_that_ends_ends_the_watch() -> None:
    rescan = Rescans()
    with pytest.raises(HotplugError, match="ended"):
        await asyncio.wait_for(watch(iter([Event("add")]), rescan, debounce_s=DEBOUNCE), 5)
    with pytest.raises(HotplugError, match="ended"):
        await asyncio.wait_for(watch(iter([]), rescan, debounce_s=DEBOUNCE), 5)


async def test_source_failing_between_bursts_ends_the_watch() -> None:
    gate = threading.Event()

    def source() -> Iterator[Event]:
        yield Event("add")
        gate.wait(10)
        raise OSError("gone")

    rescan = Rescans()
    task = asyncio.create_task(watch(source(), rescan, debounce_s=DEBOUNCE))
    await asyncio.wait_for(rescan.called.wait(), 5)
    gate.set()
    with pytest.raises(HotplugError, match="gone"):
        await asyncio.wait_for(task, 5)
    assert rescan.count == 1


async def test_healthz_goes_red_when_the_watch_ends(tmp_path: Path) -> None:
    plugin = NodePlugin(PluginSettings(node_name="n"), cast(KubeApi, object()), [])
    plugin._serving = True  # as if the servers were up and the pool published
    plugin.publisher.in_sync.set()
    assert plugin.healthy()
    with pytest.raises(HotplugError):
        await asyncio.wait_for(plugin.watch_hotplug(iter([])), 5)
    assert not plugin.healthy()
