"""A scan that meets a device changing under it is run again, not fatal.

On a real kernel a function can leave sysfs between two reads of one scan
(a hot-remove, a VF count going to zero); the enumeration then raises
OSError. The plugin's rescan runs under the hot-plug watch, whose end takes
the process down, so such a scan is run again (``scan_settled``); only one
that keeps failing ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import pytest

from driver.backoff import Backoff
from driver.devices.handler import DeviceHandler
from driver.devices.kind import SCAN_TRIES, Discovery, scan_settled
from driver.devices.model import Device
from driver.kube.api import KubeApi
from plugin.app import NodePlugin
from plugin.settings import PluginSettings

GPU = Device("gpu-0", "gpu", "GPU-0")


class Changing:
    """A family whose first ``fails`` scans meet a device leaving sysfs."""

    def __init__(self, fails: int) -> None:
        self.fails, self.scans = fails, 0

    def discover(self) -> Discovery:
        self.scans += 1
        if self.scans <= self.fails:
            raise FileNotFoundError(2, "No such file or directory", "/sys/bus/pci/devices/x/vendor")
        return Discovery(devices=(GPU,))

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {}


NOW = Backoff(0.0, 0.0)  # no wait between tries: nothing here is about time


async def test_a_scan_a_device_changed_under_is_run_again() -> None:
    family = Changing(fails=2)
    found = await scan_settled([family], NOW)
    assert found.devices == (GPU,) and family.scans == 3


async def test_a_scan_that_keeps_failing_ends_after_its_tries() -> None:
    family = Changing(fails=SCAN_TRIES)
    with pytest.raises(FileNotFoundError):
        await scan_settled([family], NOW)
    assert family.scans == SCAN_TRIES


async def test_the_plugins_rescan_outlives_a_device_changing_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hot-plug watch's rescan: before, the OSError ended the watch (and
    the process) instead of a second scan."""
    monkeypatch.setattr("driver.devices.kind.SCAN_RETRY_S", 0.0)
    family = Changing(fails=1)
    plugin = NodePlugin(PluginSettings(node_name="node-a"), cast(KubeApi, object()), [family])
    await plugin.rescan()
    assert plugin.inventory.lookup("node-a", "gpu-0") is not None and family.scans == 2
