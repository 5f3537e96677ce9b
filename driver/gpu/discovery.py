"""Turn what NVML and sysfs report about GPUs into publishable devices.

NVML tells what a GPU is; sysfs tells where it sits. ``pcieRoot`` comes from
the device's sysfs path (never guessed from the bus id), ``numaNode`` from
its ``numa_node`` file. Device names are ``gpu-<index>``: short, stable for
a given NVML enumeration order, and valid DNS labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


class PciTopology(Protocol):
    def pcie_root(self, bdf: str) -> str | None: ...
    def numa_node(self, bdf: str) -> int | None: ...


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


def gpu_device(gpu: GpuFacts, system: SystemFacts, topology: PciTopology) -> Device:
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
        name=f"gpu-{gpu.index}",
        kind="gpu",
        local_id=gpu.uuid,
        attributes=attrs,
        capacity={"memory": memory_quantity(gpu.memory_bytes)},
    )


def gpu_devices(
    gpus: Sequence[GpuFacts], system: SystemFacts, topology: PciTopology
) -> list[Device]:
    return [gpu_device(g, system, topology) for g in sorted(gpus, key=lambda g: g.index)]
