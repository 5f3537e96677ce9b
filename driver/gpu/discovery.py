"""Turn what NVML and sysfs report about GPUs into publishable devices.

NVML tells what a GPU is; sysfs tells where it sits. ``pcieRoot`` comes from
the device's sysfs path (never guessed from the bus id), ``numaNode`` from
its ``numa_node`` file. Device names are ``gpu-<n>``: short and valid DNS
labels. NVML numbers GPUs in PCI bus order, so a GPU the fabric attached
below a local one shifted every local GPU's index, and with it its name,
health record and taint. So ``n`` counts local GPUs first, in NVML order,
then the GPUs that came through a fabric adapter (:func:`local_first`): a
local GPU keeps its name while fabric GPUs come and go (docs/health.md,
"Device names"). NVML's own index stays the ``index`` attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from driver.devices.model import (
    ATTACHMENT,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttributeValue,
    Device,
    Version,
)


class GpuFacts(Protocol):
    """The NVML facts discovery needs (``driver.nvml.backend.GpuInfo``)."""

    @property
    def index(self) -> int: ...
    @property
    def minor(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def product_name(self) -> str: ...
    @property
    def brand(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def cuda_compute_capability(self) -> str: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def pci_bus_id(self) -> str: ...
    @property
    def serial(self) -> str: ...


class Place(IntEnum):
    """Where a GPU sits, in naming order: local GPUs are numbered first."""

    LOCAL = 0
    FABRIC = 1  # behind a fabric adapter's port
    GONE = 2  # left the bus since NVML enumerated it: numbered last, shifting no one


class PciTopology(Protocol):
    def pcie_root(self, bdf: str) -> str | None: ...
    def numa_node(self, bdf: str) -> int | None: ...
    def place(self, bdf: str) -> Place: ...


NAME_PREFIX = "gpu-"


def gpu_number(device: Device) -> int:
    """The ``n`` of a full GPU device named ``gpu-<n>``, which its MIG counter
    set and placements and its whole-GPU counter set carry too."""
    return int(device.name.removeprefix(NAME_PREFIX))


@dataclass(frozen=True)
class SystemFacts:
    driver_version: str
    cuda_driver_version: str


def semver(raw: str) -> Version:
    """NVML's dotted versions as semantic versions ("580.82.07" -> "580.82.7")."""
    parts = [int(p) for p in raw.strip().split(".") if p.isdigit()][:3]
    parts += [0] * (3 - len(parts))
    return Version(".".join(str(p) for p in parts))


def memory_quantity(memory_bytes: int) -> str:
    """Memory as a Kubernetes quantity in whole MiB."""
    return f"{memory_bytes // (1024 * 1024)}Mi"


def gpu_device(gpu: GpuFacts, number: int, system: SystemFacts, topology: PciTopology) -> Device:
    attrs: dict[str, AttributeValue] = {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "minor": gpu.minor,
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": semver(gpu.cuda_compute_capability),
        "driverVersion": semver(system.driver_version),
        "cudaDriverVersion": semver(system.cuda_driver_version),
        ATTACHMENT: "local",
        PCI_BUS_ID: gpu.pci_bus_id,
    }
    if gpu.serial.strip():  # the board serial: a count-based fabric manager's name for it
        attrs["serial"] = gpu.serial.strip()
    root = topology.pcie_root(gpu.pci_bus_id)
    if root is not None:
        attrs[PCIE_ROOT] = root
    numa = topology.numa_node(gpu.pci_bus_id)
    if numa is not None:
        attrs[NUMA_NODE] = numa
    return Device(
        name=f"{NAME_PREFIX}{number}",
        kind="gpu",
        local_id=gpu.uuid,
        attributes=attrs,
        capacity={"memory": memory_quantity(gpu.memory_bytes)},
    )


def local_first(gpus: Sequence[GpuFacts], topology: PciTopology) -> list[GpuFacts]:
    """The GPUs in naming order: local ones in NVML order, then fabric ones,
    then any that left the bus meanwhile (the removal's rescan drops them)."""
    return sorted(gpus, key=lambda g: (topology.place(g.pci_bus_id), g.index))


def gpu_devices(
    gpus: Sequence[GpuFacts], system: SystemFacts, topology: PciTopology
) -> list[Device]:
    """``gpu-0``.. in :func:`local_first` order."""
    ordered = local_first(gpus, topology)
    return [gpu_device(g, n, system, topology) for n, g in enumerate(ordered)]
