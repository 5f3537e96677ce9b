"""Full GPUs as a :class:`driver.devices.kind.DeviceType`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.gpu.prepare import GpuHandler
from driver.node.scanner import GpuSource, SysfsTopology, scan_gpus


class GpuType:
    def __init__(self, source: GpuSource, sysfs_root: Path, dev_root: Path) -> None:
        self._source = source
        self._topology = SysfsTopology(sysfs_root)
        self._handler = GpuHandler(dev_root)

    def discover(self) -> Discovery:
        return Discovery(devices=tuple(scan_gpus(self._source, self._topology)))

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {"gpu": self._handler}
