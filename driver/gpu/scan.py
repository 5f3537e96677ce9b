"""Enumerate the node's devices from NVML and sysfs into one device list.

A scan initialises NVML, reads every GPU once, and shuts NVML down again,
so each scan sees GPUs that arrived or left since the last one (NVML only
enumerates at init); with dynamic MIG the MIG family runs that one
enumeration in its session and builds on its facts. Scans block: the plugin
runs them in a worker thread. A GPU whose sysfs entry is missing is still
published, without topology attributes, and the gap is logged. Which GPUs
came through a fabric adapter is the fabric view's to say (``placement``,
``driver.fabric_devices.node.FabricNodeView.place``): they are numbered
after the local ones (``driver.gpu.discovery.local_first``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from driver.devices.model import Device
from driver.gpu.discovery import GpuFacts, Place, SystemFacts, gpu_devices
from driver.pci import sysfs

log = logging.getLogger(__name__)


class SystemVersions(Protocol):
    @property
    def driver_version(self) -> str: ...
    @property
    def cuda_driver_version(self) -> str: ...


class GpuSource(Protocol):
    """The subset of :class:`driver.nvml.backend.NvmlBackend` a scan uses."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def system_info(self) -> SystemVersions: ...
    def gpus(self) -> Sequence[GpuFacts]: ...


class SysfsTopology:
    """PCI placement read from a sysfs tree (the real ``/sys`` or a simulated one);
    ``placement``: local or fabric, by PCI address (None: a node without
    fabric adapters, every GPU local)."""

    def __init__(self, root: Path, placement: Callable[[str], Place] | None = None) -> None:
        self.root = root
        self._placement = placement

    def place(self, bdf: str) -> Place:
        return self._placement(bdf) if self._placement is not None else Place.LOCAL

    def pcie_root(self, bdf: str) -> str | None:
        try:
            return sysfs.pcie_root(self.root, bdf)
        except (OSError, ValueError) as exc:
            log.warning("no PCIe root for %s under %s: %s", bdf, self.root, exc)
            return None

    def numa_node(self, bdf: str) -> int | None:
        try:
            return sysfs.numa_node(self.root, bdf)
        except (OSError, ValueError):
            return None


def scan_gpus(source: GpuSource, topology: SysfsTopology) -> list[Device]:
    """Every GPU NVML reports now, as devices of the node pool."""
    source.init()
    try:
        return devices_of(source.system_info(), source.gpus(), topology)
    finally:
        source.shutdown()


def devices_of(
    info: SystemVersions, gpus: Sequence[GpuFacts], topology: SysfsTopology
) -> list[Device]:
    """The node pool's GPU devices from one enumeration's facts."""
    system = SystemFacts(info.driver_version, info.cuda_driver_version)
    return gpu_devices(gpus, system, topology)


FullGpus = Callable[[SystemVersions, Sequence[GpuFacts]], list[Device]]
"""Turns one NVML enumeration into the full-GPU devices (what
:class:`driver.gpu.kind.Partitions` calls inside its own NVML session)."""
