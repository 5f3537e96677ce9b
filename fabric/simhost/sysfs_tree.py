"""Writing a sysfs-shaped directory tree for one simulated host.

Layout, as the kernel presents it (all links relative, like the kernel's):

    devices/pci0000:3a/0000:3a:01.0/0000:3b:00.0/{vendor,device,class,...}
    bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:3a/.../0000:3b:00.0
    bus/pci/drivers/<name>/{bind,unbind,<bdf> -> device}
    bus/pci/drivers_probe
    kernel/iommu_groups/<n>/devices/<bdf> -> device;  <device>/iommu_group -> group
    <pf>/virtfnN -> ../<vf>;  <vf>/physfn -> ../<pf>;  <dev>/net/<ifname>/

Files the driver writes (``driver_override``, ``bind``, ``unbind``,
``drivers_probe``) are plain files here; ``effects.py`` applies them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from fabric.simhost.topology import Nic, bdf_parts, make_bdf

PCI_DEVICE_IDS = {
    "A100-SXM4-40GB": (0x20B0, 0x134F),
    "A100-SXM4-80GB": (0x20B2, 0x147F),
    "H100-SXM5-80GB": (0x2330, 0x16C1),
    "H200-SXM5-141GB": (0x2335, 0x18BE),
    "L40S": (0x26B9, 0x1851),
}
NVIDIA = 0x10DE
CLASS_GPU = 0x030200
CLASS_NET = 0x020000
CLASS_BRIDGE = 0x060400
CLASS_NVME = 0x010802  # mass storage, non-volatile memory, NVMe
CLASS_CXL_MEMORY = 0x050210  # memory controller, CXL, CXL.mem


@dataclass(frozen=True)
class PciFunction:
    bdf: str
    vendor: int
    device: int
    klass: int
    numa_node: int
    driver: str | None
    subsystem: tuple[int, int] = (0, 0)


def derived_mac(seed: str) -> str:
    """A stable, locally administered unicast MAC address derived from ``seed``."""
    digest = hashlib.sha256(seed.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def _link_name(link: Path) -> str | None:
    """The last name of ``link``'s target, None when there is none (one
    readlink: a reader outside the host lock may meet an unbind)."""
    try:
        return link.readlink().name
    except OSError:
        return None


def relink(link: Path, target: Path) -> None:
    """Create (or replace) ``link`` pointing at ``target`` with a relative path."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


class SysfsTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.devices = root / "devices"
        self.bus_devices = root / "bus" / "pci" / "devices"
        self.drivers = root / "bus" / "pci" / "drivers"
        self.groups = root / "kernel" / "iommu_groups"

    def skeleton(self) -> None:
        for d in (self.devices, self.bus_devices, self.drivers, self.groups):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "bus" / "pci" / "drivers_probe").write_text("")

    def root_complex(self, name: str) -> Path:
        path = self.devices / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def path_of(self, bdf: str) -> Path:
        return Path(os.path.realpath(self.bus_devices / bdf))

    def exists(self, bdf: str) -> bool:
        return (self.bus_devices / bdf).is_symlink()

    def driver_dir(self, name: str) -> Path:
        d = self.drivers / name
        if not d.is_dir():
            d.mkdir(parents=True)
            for f in ("bind", "unbind", "new_id", "remove_id"):
                (d / f).write_text("")
        return d

    def _next_group(self) -> int:
        used = [int(p.name) for p in self.groups.iterdir() if p.name.isdigit()]
        return max(used, default=-1) + 1

    def add_function(self, parent: Path, fn: PciFunction, publish: bool = True) -> Path:
        """Lay out a function and, last, its ``bus/pci/devices`` link: a reader
        listing the bus sees the function whole or not at all. ``publish``
        False leaves the link to :meth:`publish`, for a caller that builds
        more below the function first (a drive's namespaces, a NIC's VFs)."""
        if self.exists(fn.bdf) or (parent / fn.bdf).exists():
            raise FileExistsError(f"{fn.bdf} already exists")
        path = parent / fn.bdf
        path.mkdir(parents=True)
        values = {
            "vendor": f"0x{fn.vendor:04x}",
            "device": f"0x{fn.device:04x}",
            "class": f"0x{fn.klass:06x}",
            "subsystem_vendor": f"0x{fn.subsystem[0]:04x}",
            "subsystem_device": f"0x{fn.subsystem[1]:04x}",
            "numa_node": str(fn.numa_node),
            "driver_override": "(null)",
            "uevent": (
                f"PCI_CLASS={fn.klass:X}\nPCI_ID={fn.vendor:04X}:{fn.device:04X}\n"
                f"PCI_SUBSYS_ID={fn.subsystem[0]:04X}:{fn.subsystem[1]:04X}\n"
                f"PCI_SLOT_NAME={fn.bdf}\n"
            ),
        }
        for name, value in values.items():
            (path / name).write_text(value + "\n")
        group = self.groups / str(self._next_group())
        relink(group / "devices" / fn.bdf, path)
        relink(path / "iommu_group", group)
        if fn.driver:
            self._bind_path(fn.bdf, path, fn.driver)
        if publish:
            self.publish(fn.bdf, path)
        return path

    def publish(self, bdf: str, path: Path) -> None:
        """Make a laid-out function visible on the bus (its last step)."""
        relink(self.bus_devices / bdf, path)

    def add_nic(self, parent: Path, nic: Nic, numa_node: int) -> list[str]:
        """Add a PF with its VFs (siblings under the same parent); returns all BDFs."""
        pf = self.add_function(
            parent,
            PciFunction(nic.bdf, nic.vendor_id, nic.device_id, CLASS_NET, numa_node, nic.driver),
            publish=False,
        )
        (pf / "net" / nic.netdev).mkdir(parents=True)
        (pf / "net" / nic.netdev / "address").write_text(f"{nic.mac or derived_mac(nic.bdf)}\n")
        (pf / "net" / nic.netdev / "speed").write_text(f"{nic.speed_mbps}\n")
        (pf / "sriov_totalvfs").write_text(f"{nic.total_vfs}\n")
        (pf / "sriov_offset").write_text(f"{nic.vf_offset}\n")
        (pf / "sriov_stride").write_text(f"{nic.vf_stride}\n")
        (pf / "sriov_vf_device").write_text(f"{nic.vf_device_id:x}\n")
        (pf / "sriov_numvfs").write_text(f"{nic.num_vfs}\n")
        vfs = [self._add_vf(pf, nic.bdf, i) for i in range(nic.num_vfs)]
        self.publish(nic.bdf, pf)  # last: the PF appears with its VFs, in one step
        return [nic.bdf, *vfs]

    def add_vf(self, pf_bdf: str, index: int) -> str:
        """Create VF ``index`` of a PF from the PF's own SR-IOV files (as the
        kernel does on a write to ``sriov_numvfs``); returns its address."""
        return self._add_vf(self.path_of(pf_bdf), pf_bdf, index)

    def _add_vf(self, pf: Path, pf_bdf: str, index: int) -> str:

        def num(name: str, base: int = 10) -> int:
            return int((pf / name).read_text().strip(), base)

        dom, bus, dev, fn = bdf_parts(pf_bdf)
        devfn = (dev << 3 | fn) + num("sriov_offset") + index * num("sriov_stride")
        vf_bdf = make_bdf(dom, bus + (devfn >> 8), devfn & 0xFF)
        driver = _link_name(pf / "driver")
        vf = self.add_function(
            pf.parent,
            PciFunction(
                vf_bdf,
                num("vendor", 16),
                num("sriov_vf_device", 16),
                CLASS_NET,
                num("numa_node"),
                driver,
            ),
            publish=False,
        )
        netdevs = sorted(p.name for p in (pf / "net").iterdir()) if (pf / "net").is_dir() else []
        if netdevs:
            (vf / "net" / f"{netdevs[0]}v{index}").mkdir(parents=True)
        relink(vf / "physfn", pf)
        self.publish(vf_bdf, vf)
        relink(pf / f"virtfn{index}", vf)  # last: the PF lists only whole VFs
        return vf_bdf

    def remove_vf(self, pf_bdf: str, index: int) -> None:
        link = self.path_of(pf_bdf) / f"virtfn{index}"
        self.remove_function(Path(os.path.realpath(link)).name)
        link.unlink(missing_ok=True)

    def remove_function(self, bdf: str) -> None:
        """Remove a device (and everything below it, e.g. a switch's devices);
        a function already gone is no error (a hot-remove that is finished
        again, or undone after a failed add)."""
        if not self.exists(bdf):
            return
        path = self.path_of(bdf)
        below = [
            p.name
            for p in path.rglob("*")
            if p.is_dir() and (self.bus_devices / p.name).is_symlink()
        ]
        for name in [*below, bdf]:
            self.unbind(name)
            group = self.bus_devices / name / "iommu_group"
            if group.is_symlink():
                shutil.rmtree(Path(os.path.realpath(group)), ignore_errors=True)
            (self.bus_devices / name).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)

    def driver_of(self, bdf: str) -> str | None:
        return _link_name(self.bus_devices / bdf / "driver")

    def bind(self, bdf: str, driver: str) -> None:
        self._bind_path(bdf, self.path_of(bdf), driver)

    def _bind_path(self, bdf: str, path: Path, driver: str) -> None:
        d = self.driver_dir(driver)
        relink(path / "driver", d)
        relink(d / bdf, path)

    def unbind(self, bdf: str) -> None:
        driver = self.driver_of(bdf)
        if driver is None:
            return
        (self.bus_devices / bdf / "driver").unlink()
        (self.drivers / driver / bdf).unlink(missing_ok=True)
