"""Where a container's fabric devices sit on its node's host: their PCIe roots.

Why a module: the pairing e2e tests (tests/e2e/test_fabric_domain_e2e.py)
check a pairing's constraint where it matters, in what the container was
given: each device the container's env names is found on the simulated
host (the GPU by its UUID in the NVML state, an NVMe drive by its
controller's PCI address, CXL memory by its memdev's serial) and its root
complex read from the host's sysfs tree, as the plugin reads a local
device's. Shared by the pairing cases, so each says only what it pairs.
"""

from __future__ import annotations

import os
from pathlib import Path

from driver.pci.sysfs import pcie_root
from tests.harness.simnode import SimNode


def root_of(sysfs_root: Path, path: Path) -> str:
    """The root complex (``pciDDDD:BB``) a sysfs device path sits under."""
    devices = Path(os.path.realpath(sysfs_root / "devices"))
    (root, *_) = Path(os.path.realpath(path)).relative_to(devices).parts
    assert root.startswith("pci"), f"{path} is not below a PCI root complex"
    return root


def gpu_root(sim: SimNode, uuid: str) -> str:
    """The root of the GPU the container sees as ``uuid`` (NVML's bus ID on the host)."""
    (bus_id,) = [g["pci_bus_id"] for g in sim.host.nvml.read()["gpus"] if g["uuid"] == uuid]
    return pcie_root(sim.host.sysfs_root, bus_id[-12:])  # NVML's 8-digit domain: the BDF's 4


def nvme_root(sim: SimNode, block: str) -> str:
    """The root of the NVMe controller of namespace ``block`` (``/dev/nvmeXn1``)."""
    ctrl = Path(block).name.rsplit("n", 1)[0]  # nvmeX
    address = (sim.host.sysfs_root / "class/nvme" / ctrl / "address").read_text().strip()
    return pcie_root(sim.host.sysfs_root, address)


def same_serial(a: str, b: str) -> bool:
    """Serials as sysfs writes them (hex) and as a node reports them, alike."""
    try:
        return int(a, 0) == int(b, 0)
    except ValueError:
        return a.strip().lower() == b.strip().lower()


def cxl_root(sim: SimNode, serial: str) -> str:
    """The root of the CXL memory device whose memdev has ``serial``."""
    bus = sim.host.sysfs_root / "bus/cxl/devices"
    (mem,) = [
        m for m in bus.glob("mem*") if same_serial((m / "serial").read_text().strip(), serial)
    ]
    return root_of(sim.host.sysfs_root, Path(os.path.realpath(mem)).parent)  # its PCI function
