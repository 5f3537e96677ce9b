"""What an NVMe drive looks like in sysfs and /dev once the ``nvme`` driver bound it.

Why this module exists: the plugin discovers NVMe drives from these files
alone, so the simulated host must write them where Linux does (the layout
without native multipath, where the namespace sits under its controller)::

    devices/.../<bdf>/nvme/nvme0/{serial,model,firmware_rev,subsysnqn,transport,
                                  address,state,numa_node,cntlid,dev}
    devices/.../<bdf>/nvme/nvme0/nvme0n1/{size,nsid,wwid,dev,queue/logical_block_size}
    devices/.../<bdf>/nvme/nvme0/ng0n1/dev
    class/nvme/nvme0, block/nvme0n1, class/block/nvme0n1, class/nvme-generic/ng0n1
    /dev/nvme0 (char), /dev/nvme0n1 (block), /dev/ng0n1 (char)

``size`` counts 512-byte sectors whatever the namespace's block size, as the
kernel's does. The controller instance is the lowest free one.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from fabric.simhost import devnodes
from fabric.simhost.sysfs_tree import relink
from fabric.simhost.topology import Nvme

SECTOR = 512


def derived_serial(seed: str) -> str:
    """A drive serial as vendors print them (14 characters) derived from ``seed``."""
    return "S6" + hashlib.sha256(seed.encode()).hexdigest()[:12].upper()


def subsystem_nqn(serial: str, model: str) -> str:
    return f"nqn.2014.08.org.nvmexpress:144d144d{serial}{model}".replace(" ", "")


def _write(directory: Path, values: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (directory / name).write_text(value + "\n")


class NvmeSysfs:
    """Writes and removes NVMe controllers below PCI functions of one tree."""

    def __init__(self, sysfs_root: Path, dev_root: Path) -> None:
        self.root = sysfs_root
        self.dev_root = dev_root
        self.class_nvme = sysfs_root / "class" / "nvme"
        self.class_generic = sysfs_root / "class" / "nvme-generic"
        self.block = sysfs_root / "block"
        self.class_block = sysfs_root / "class" / "block"

    def _instance(self) -> int:
        used = {int(p.name[4:]) for p in self.class_nvme.glob("nvme*") if p.name[4:].isdigit()}
        return devnodes.lowest_free(used)

    def add(self, pci: Path, drive: Nvme, serial: str, numa: int) -> str:
        """Bind-time view of ``drive`` at PCI function ``pci``; returns ``nvmeN``."""
        n = self._instance()
        name = f"nvme{n}"
        ctrl = pci / "nvme" / name
        _write(
            ctrl,
            {
                "serial": serial,
                "model": drive.model,
                "firmware_rev": drive.firmware,
                "subsysnqn": drive.nqn or subsystem_nqn(serial, drive.model),
                "transport": "pcie",
                "address": pci.name,
                "state": "live",
                "numa_node": str(numa),
                "cntlid": "6",
                "dev": f"{devnodes.NVME_CHAR_MAJOR}:{n}",
            },
        )
        relink(ctrl / "device", pci)
        relink(self.class_nvme / name, ctrl)
        devnodes.make_node(self.dev_root, name, "c", devnodes.NVME_CHAR_MAJOR, n)
        for nsid, size in enumerate(drive.namespaces, start=1):
            self._add_namespace(ctrl, n, nsid, size, serial)
        return name

    def _add_namespace(self, ctrl: Path, n: int, nsid: int, size: int, serial: str) -> None:
        block, generic = f"nvme{n}n{nsid}", f"ng{n}n{nsid}"
        minor = devnodes.lowest_free(
            devnodes.used_minors(self.root, "block/*/dev", devnodes.NVME_BLOCK_MAJOR)
        )
        wwid = "eui." + hashlib.sha256(f"{serial}/{nsid}".encode()).hexdigest()[:16]
        ns = ctrl / block
        _write(
            ns,
            {
                "size": str(size // SECTOR),
                "nsid": str(nsid),
                "wwid": wwid,
                "dev": f"{devnodes.NVME_BLOCK_MAJOR}:{minor}",
            },
        )
        _write(ns / "queue", {"logical_block_size": "4096"})
        relink(ns / "device", ctrl)
        relink(self.block / block, ns)
        relink(self.class_block / block, ns)
        devnodes.make_node(self.dev_root, block, "b", devnodes.NVME_BLOCK_MAJOR, minor)
        gen_minor = devnodes.lowest_free(
            devnodes.used_minors(self.root, "class/nvme-generic/*/dev", devnodes.NVME_GENERIC_MAJOR)
        )
        _write(ctrl / generic, {"dev": f"{devnodes.NVME_GENERIC_MAJOR}:{gen_minor}"})
        relink(self.class_generic / generic, ctrl / generic)
        devnodes.make_node(self.dev_root, generic, "c", devnodes.NVME_GENERIC_MAJOR, gen_minor)

    def remove(self, pci: Path) -> list[str]:
        """Undo :meth:`add` for the controllers below ``pci``; the names removed."""
        gone = []
        for ctrl in sorted((pci / "nvme").glob("nvme*")):
            for child in sorted(ctrl.iterdir()):
                if child.is_dir() and not child.is_symlink() and (child / "dev").exists():
                    for links in (self.block, self.class_block, self.class_generic):
                        (links / child.name).unlink(missing_ok=True)
                    devnodes.remove_node(self.dev_root, child.name)
                    gone.append(child.name)
            (self.class_nvme / ctrl.name).unlink(missing_ok=True)
            devnodes.remove_node(self.dev_root, ctrl.name)
            gone.append(ctrl.name)
            shutil.rmtree(ctrl)
        return gone
