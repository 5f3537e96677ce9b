"""Find CXL Type 3 memory in devdax mode in sysfs, the way ``daxctl`` and ``cxl list`` do.

Why this module exists: the unit a container can be handed is the dax
device ``/sys/bus/dax/devices/daxR.0`` (bound to ``device_dax``; ``size`` in
bytes, ``target_node`` the memory-only NUMA node of its window), but the
identity the fabric knows is the memory device's serial and its placement
is the PCI function's. The chain between them is the kernel's: the dax
device sits below ``regionR``, whose ``target0`` names an endpoint decoder
``decoderE.0`` below ``endpointE``, whose ``uport`` is the memdev ``memX``
below the PCI function (``serial``, ``ram/size``). Regions interleaved over
several devices have no single identity and are not offered; a dax device
that ``kmem`` took (system-RAM mode) is no device node a container could get
and is not offered either (docs: CDI cannot give a container
``cpuset.mems``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from driver.cxl import KIND
from driver.cxl.serial import cxl_identity
from driver.devices.model import (
    ATTACHMENT,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttributeValue,
    Device,
)
from driver.devices.nodes import DevNode, dev_node
from driver.devices.quantity import of_bytes
from driver.pci import sysfs
from driver.vf.discovery import read, read_int

log = logging.getLogger(__name__)

DEVDAX_DRIVER = "device_dax"


@dataclass(frozen=True)
class DaxMemory:
    """One devdax device of CXL memory and the memdev behind it."""

    dax: DevNode  # daxR.0
    size: int  # bytes
    target_node: int
    memdev: str  # memX
    bdf: str  # the memdev's PCI function
    serial: str  # canonical (driver.fabric_devices.naming.cxl_identity)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _memdev_of_region(sysfs_root: Path, region: Path) -> Path | None:
    ways = read_int(region / "interleave_ways")
    if ways != 1:
        log.info("CXL %s interleaves %s devices: not offered", region.name, ways)
        return None
    decoder = read(region / "target0") or ""
    bus = sysfs_root / "bus" / "cxl" / "devices"
    if not decoder or not (bus / decoder).exists():
        return None
    uport = _real(bus / decoder).parent / "uport"
    return _real(uport) if uport.is_symlink() else None


def dax_memory(sysfs_root: Path, link: Path) -> DaxMemory | None:
    """The devdax device ``link`` (``bus/dax/devices/daxR.0``) with its memdev, or None."""
    dax = _real(link)
    driver = dax / "driver"
    if not driver.is_symlink() or _real(driver).name != DEVDAX_DRIVER:
        log.debug("%s is not in devdax mode; not offered", link.name)
        return None
    region = next((p for p in dax.parents if p.name.startswith("region")), None)
    memdev = _memdev_of_region(sysfs_root, region) if region is not None else None
    node, size, target = dev_node(dax), read_int(dax / "size"), read_int(dax / "target_node")
    if memdev is None or node is None or size is None or target is None:
        log.info("%s: no single CXL memory device or incomplete in sysfs; not offered", link.name)
        return None
    raw_serial = read(memdev / "serial")
    if raw_serial is None:
        return None
    return DaxMemory(
        dax=DevNode(link.name, node.major, node.minor),
        size=size,
        target_node=target,
        memdev=memdev.name,
        bdf=memdev.parent.name,
        serial=cxl_identity(raw_serial),
    )


def memories(sysfs_root: Path) -> list[DaxMemory]:
    """Every devdax CXL memory device, by dax name."""
    bus = sysfs_root / "bus" / "dax" / "devices"
    out = []
    for link in sorted(bus.iterdir()) if bus.is_dir() else []:
        try:
            found = dax_memory(sysfs_root, link)
        except (OSError, ValueError) as exc:
            log.warning("%s left out: %s", link.name, exc)
            continue
        if found is not None:
            out.append(found)
    return out


def memory_at(sysfs_root: Path, bdf: str) -> DaxMemory | None:
    """The devdax memory of the CXL device at ``bdf`` (read again at prepare)."""
    return next((m for m in memories(sysfs_root) if m.bdf == bdf), None)


def device_name(bdf: str) -> str:
    """A DNS label from the memdev's address: ``0000:87:00.0`` -> ``cxlmem-0000-87-00-0``."""
    return f"{KIND}-" + bdf.lower().replace(":", "-").replace(".", "-")


def cxl_device(sysfs_root: Path, memory: DaxMemory) -> Device:
    attrs: dict[str, AttributeValue] = {
        ATTACHMENT: "local",
        PCI_BUS_ID: memory.bdf,
        PCIE_ROOT: sysfs.pcie_root(sysfs_root, memory.bdf),
        NUMA_NODE: memory.target_node,
        "serial": memory.serial,
        "mode": "devdax",
    }
    cpu_node = sysfs.numa_node(sysfs_root, memory.bdf)
    if cpu_node is not None:
        attrs["hostNumaNode"] = cpu_node  # the CPUs nearest the device's port
    return Device(
        name=device_name(memory.bdf),
        kind=KIND,
        local_id=memory.bdf,
        attributes=attrs,
        capacity={"capacity": of_bytes(memory.size)},
    )
