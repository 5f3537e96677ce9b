"""Find NVMe drives in sysfs, as the ``nvme`` driver shows them.

Why this module exists: NVMe drives are not visible to NVML, and their
placement (``pcieRoot``, ``numaNode``) must come from the same sysfs tree the
GPU scan reads, so a GPU and a drive behind one root complex (GPUDirect
Storage) carry equal attributes. A drive is a controller under
``class/nvme/nvmeN`` with transport ``pcie`` (NVMe over fabrics controllers
have no PCI function of their own and are not offered) in state ``live``;
``address`` names its PCI function. Its namespaces are the ``nvmeXnY`` block
devices (``size`` in 512-byte sectors) and ``ngXnY`` generic character
devices below the controller, or, with native multipath, below the
``nvme-subsystem`` that lists the controller. Device numbers come from each
device's ``dev`` attribute, as udev reads them.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

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
from driver.nvme import KIND
from driver.pci import sysfs
from driver.vf.discovery import read, read_int

log = logging.getLogger(__name__)

SECTOR = 512
_BLOCK = re.compile(r"^nvme\d+n\d+$")


@dataclass(frozen=True)
class Namespace:
    nsid: int
    size: int  # bytes
    block: DevNode
    generic: DevNode | None  # ngXnY (Linux 5.13+)


@dataclass(frozen=True)
class Controller:
    name: str  # nvmeN
    bdf: str
    serial: str
    model: str
    firmware: str
    nqn: str
    namespaces: tuple[Namespace, ...]
    node: DevNode | None = None  # /dev/nvmeN, the admin (and health) interface

    @property
    def capacity(self) -> int:
        return sum(ns.size for ns in self.namespaces)


def _holder(sysfs_root: Path, ctrl: Path) -> Path:
    """Where the controller's namespaces sit: itself, or its multipath subsystem."""
    for subsys in (sysfs_root / "class" / "nvme-subsystem").glob("nvme-subsys*"):
        try:
            if (subsys / ctrl.name).exists() and any(
                _BLOCK.match(p.name) for p in subsys.iterdir()
            ):
                return Path(os.path.realpath(subsys))
        except OSError:  # not a directory: not a subsystem the kernel made
            continue
    return ctrl


def namespaces(sysfs_root: Path, ctrl: Path) -> tuple[Namespace, ...]:
    holder = _holder(sysfs_root, ctrl)
    children = {p.name: p for p in holder.iterdir()} if holder.is_dir() else {}
    out = []
    for name in sorted(n for n in children if _BLOCK.match(n)):
        path = children[name]
        block, sectors, nsid = dev_node(path), read_int(path / "size"), read_int(path / "nsid")
        if block is None or sectors is None or nsid is None:
            log.warning("NVMe namespace %s is incomplete in sysfs; not offered", path)
            continue
        generic_name = "ng" + name.removeprefix("nvme")
        generic = dev_node(children[generic_name]) if generic_name in children else None
        out.append(Namespace(nsid, sectors * SECTOR, block, generic))
    return tuple(out)


def controllers(sysfs_root: Path) -> list[Controller]:
    """Every live PCIe NVMe controller with at least one namespace, by name."""
    out = []
    class_dir = sysfs_root / "class" / "nvme"
    for link in sorted(class_dir.iterdir()) if class_dir.is_dir() else []:
        ctrl = Path(os.path.realpath(link))
        if read(ctrl / "transport") != "pcie":
            continue
        state, bdf = read(ctrl / "state"), (read(ctrl / "address") or "").lower()
        if state != "live":
            log.info("NVMe controller %s (%s) is %s, not live; not offered", link.name, bdf, state)
            continue
        found = namespaces(sysfs_root, ctrl)
        if not found:
            log.info("NVMe controller %s (%s) has no namespace; not offered", link.name, bdf)
            continue
        out.append(
            Controller(
                name=link.name,
                bdf=bdf,
                serial=(read(ctrl / "serial") or "").strip(),
                model=(read(ctrl / "model") or "").strip(),
                firmware=(read(ctrl / "firmware_rev") or "").strip(),
                nqn=read(ctrl / "subsysnqn") or "",
                namespaces=found,
                node=dev_node(ctrl),
            )
        )
    return out


def controller_at(sysfs_root: Path, bdf: str) -> Controller | None:
    """The live controller of the PCI function ``bdf`` (read again at prepare)."""
    return next((c for c in controllers(sysfs_root) if c.bdf == bdf), None)


def device_name(bdf: str) -> str:
    """A DNS label from a drive's address: ``0000:1a:00.0`` -> ``nvme-0000-1a-00-0``."""
    return f"{KIND}-" + bdf.lower().replace(":", "-").replace(".", "-")


def nvme_device(sysfs_root: Path, ctrl: Controller) -> Device:
    attrs: dict[str, AttributeValue] = {
        ATTACHMENT: "local",
        PCI_BUS_ID: ctrl.bdf,
        PCIE_ROOT: sysfs.pcie_root(sysfs_root, ctrl.bdf),
        "serial": ctrl.serial,
        "model": ctrl.model,
        "firmwareRevision": ctrl.firmware,
        "namespaces": len(ctrl.namespaces),
    }
    numa = sysfs.numa_node(sysfs_root, ctrl.bdf)
    if numa is not None:
        attrs[NUMA_NODE] = numa
    return Device(
        name=device_name(ctrl.bdf),
        kind=KIND,
        local_id=ctrl.bdf,
        attributes=attrs,
        capacity={"capacity": of_bytes(ctrl.capacity)},
    )


def scan(sysfs_root: Path) -> list[tuple[Controller, Device]]:
    """Each drive with its published device; a drive sysfs shows only in part is left out."""
    out = []
    for ctrl in controllers(sysfs_root):
        try:
            out.append((ctrl, nvme_device(sysfs_root, ctrl)))
        except (OSError, ValueError) as exc:
            log.warning("NVMe drive %s (%s) left out: %s", ctrl.name, ctrl.bdf, exc)
    return out
