"""NVMe drives as a :class:`driver.devices.kind.DeviceType`.

Why this module exists: it ties the NVMe family together for the plugin and
decides which drives are offered. A node's boot or data drive must never be
handed to a tenant by default, so local drives are offered only when the
``--nvme-drives`` setting selects them (``all``, or serials and PCI
addresses); a drive behind a fabric adapter (``always``) is offered whatever
the setting says, to the fabric claim that asked for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.nvme import KIND
from driver.nvme.discovery import Controller, scan
from driver.nvme.prepare import NvmeHandler


@dataclass(frozen=True)
class DriveSelection:
    """Which local drives are offered: every one, or those named by serial or address."""

    every: bool = False
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, spec: str) -> DriveSelection:
        items = {p.strip() for p in spec.split(",") if p.strip()}
        if "all" in items:
            return cls(every=True)
        return cls(names=frozenset(i.lower() for i in items))

    def selects(self, ctrl: Controller) -> bool:
        return self.every or ctrl.serial.lower() in self.names or ctrl.bdf in self.names

    def __bool__(self) -> bool:
        return self.every or bool(self.names)


class NvmeType:
    """NVMe drives the selection names, plus those ``always`` accepts by address."""

    def __init__(
        self,
        selection: DriveSelection,
        sysfs_root: Path,
        dev_root: Path,
        always: Callable[[str], bool] | None = None,
    ) -> None:
        self._selection = selection
        self._always = always
        self._sysfs = sysfs_root
        self._handler = NvmeHandler(sysfs_root, dev_root)

    def discover(self) -> Discovery:
        if not self._selection and self._always is None:
            return Discovery()
        found = [
            device
            for ctrl, device in scan(self._sysfs)
            if self._selection.selects(ctrl)
            or (self._always is not None and self._always(ctrl.bdf))
        ]
        return Discovery(devices=tuple(found))

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {KIND: self._handler}
