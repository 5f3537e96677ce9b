"""CXL Type 3 memory as a :class:`driver.devices.kind.DeviceType`.

Why this module exists: it ties the CXL memory family together for the
plugin and decides what is offered. CXL memory comes to a node only from
the fabric (hot-added behind an adapter); devdax memory that is local to
the node is left to whoever put it in devdax mode, so only devices
``behind`` accepts by address (those behind a fabric adapter) are scanned
into devices, which the fabric view then keeps out of the node's own pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from driver.cxl import KIND
from driver.cxl.discovery import cxl_device, memories
from driver.cxl.prepare import CxlMemoryHandler
from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery

log = logging.getLogger(__name__)


class CxlMemoryType:
    """Devdax CXL memory devices whose PCI function ``behind`` accepts."""

    def __init__(self, sysfs_root: Path, dev_root: Path, behind: Callable[[str], bool]) -> None:
        self._sysfs = sysfs_root
        self._behind = behind
        self._handler = CxlMemoryHandler(sysfs_root, dev_root)

    def discover(self) -> Discovery:
        found = []
        for memory in memories(self._sysfs):
            if not self._behind(memory.bdf):
                log.debug("CXL memory %s is local to the node: not offered", memory.bdf)
                continue
            try:
                found.append(cxl_device(self._sysfs, memory))
            except (OSError, ValueError) as exc:
                log.warning("CXL memory %s (%s) left out: %s", memory.dax.name, memory.bdf, exc)
        return Discovery(devices=tuple(found))

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {KIND: self._handler}
