"""What CXL Type 3 memory looks like in sysfs and /dev after a hot-add, in devdax mode.

Why this module exists: the plugin finds CXL memory the way ``cxl list`` and
``daxctl`` do, from the cxl and dax buses, so the simulated host writes the
chain Linux builds once ``cxl_pci`` bound the device and a RAM region was
created in a firmware window (``ram/size``, ``serial`` and ``size`` hex as the
kernel prints them, dax ``size`` decimal)::

    devices/.../<bdf>/mem0/{serial,ram/size,pmem/size,numa_node,dev}
    devices/platform/ACPI0017:00/root0/decoder0.W                 root decoder (window W)
    devices/platform/ACPI0017:00/root0/endpointE/{uport -> mem0, decoderE.0/}
    devices/platform/ACPI0017:00/root0/decoder0.W/regionR/{size,mode,target0,...}
    .../regionR/dax_regionR/daxR.0/{size,target_node,numa_node,align,dev}
    bus/cxl/devices/{mem0,endpointE,decoderE.0,regionR,root0,decoder0.W}
    bus/dax/devices/daxR.0 (bound to device_dax)
    devices/system/node/nodeK/cpulist (empty: a memory-only NUMA node)
    /dev/daxR.0

One window per fabric adapter, each with its own memory-only NUMA node (the
node firmware reserves for a CXL window), so memory behind one adapter lands
on one node. System-RAM mode (``kmem`` onlining the region as NUMA memory,
``/dev/daxR.0`` gone) is not simulated: patchbay hands CXL memory to a
container as the devdax device, because CDI can give a container device
nodes, mounts and environment but no ``cpuset.mems``, so a container could
not be confined to (or kept off) a kmem node.
"""

from __future__ import annotations

import os
import shutil
import uuid as uuidlib
from pathlib import Path

from fabric.simhost import devnodes
from fabric.simhost.sysfs_tree import relink
from fabric.simhost.topology import CxlMemory

ROOT_PORT = Path("platform") / "ACPI0017:00" / "root0"
DAX_ALIGN = 2 << 20


def _write(directory: Path, values: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (directory / name).write_text(value + "\n")


def _numbered(directory: Path, prefix: str) -> set[int]:
    out = set()
    for p in directory.glob(f"{prefix}*"):
        tail = p.name[len(prefix) :].split(".")[0]
        if tail.isdigit():
            out.add(int(tail))
    return out


class CxlSysfs:
    """Writes and removes hot-added CXL memory devices of one tree."""

    def __init__(self, sysfs_root: Path, dev_root: Path) -> None:
        self.root = sysfs_root
        self.dev_root = dev_root
        self.cxl_bus = sysfs_root / "bus" / "cxl" / "devices"
        self.dax_bus = sysfs_root / "bus" / "dax" / "devices"
        self.device_dax = sysfs_root / "bus" / "dax" / "drivers" / "device_dax"
        self.nodes = sysfs_root / "devices" / "system" / "node"
        self.root0 = sysfs_root / "devices" / ROOT_PORT

    def cpu_nodes(self, cpus_per_node: int, numa_nodes: set[int]) -> None:
        """The NUMA nodes with CPUs (built with the host)."""
        for node in sorted(numa_nodes):
            first = node * cpus_per_node
            _write(self.nodes / f"node{node}", {"cpulist": f"{first}-{first + cpus_per_node - 1}"})

    def _window(self, window: int) -> tuple[Path, int]:
        """Root decoder ``decoder0.<window>`` and its memory-only node, made on first use."""
        decoder = self.root0 / f"decoder0.{window}"
        if not self.root0.is_dir():
            _write(self.root0, {"uevent": ""})
            relink(self.cxl_bus / "root0", self.root0)
        cpu = {
            int(p.name[4:])
            for p in self.nodes.glob("node*")
            if p.name[4:].isdigit() and (p / "cpulist").read_text().strip()
        }
        node = max(cpu, default=-1) + 1 + window
        if not decoder.is_dir():
            _write(decoder, {"target_type": "expander", "cap_ram": "1", "target_list": "0"})
            relink(self.cxl_bus / decoder.name, decoder)
        _write(self.nodes / f"node{node}", {"cpulist": ""})
        return decoder, node

    def add(self, pci: Path, memory: CxlMemory, numa: int, window: int) -> str:
        """The memdev, endpoint, region and dax device of ``memory`` at ``pci``; ``daxR.0``."""
        mem_n = devnodes.lowest_free(_numbered(self.cxl_bus, "mem"))
        mem = pci / f"mem{mem_n}"
        _write(
            mem,
            {
                "serial": f"{memory.serial:#x}",
                "numa_node": str(numa),
                "firmware_version": "1.0",
                "dev": f"{devnodes.CXL_MEM_MAJOR}:{mem_n}",
            },
        )
        _write(mem / "ram", {"size": f"{memory.size:#x}"})
        _write(mem / "pmem", {"size": "0x0"})
        relink(self.cxl_bus / mem.name, mem)
        root_decoder, target_node = self._window(window)
        ep_n = devnodes.lowest_free(_numbered(self.cxl_bus, "endpoint") | {0})
        endpoint = self.root0 / f"endpoint{ep_n}"
        ep_decoder = endpoint / f"decoder{ep_n}.0"
        _write(ep_decoder, {"mode": "ram", "size": f"{memory.size:#x}", "interleave_ways": "1"})
        relink(endpoint / "uport", mem)
        relink(self.cxl_bus / endpoint.name, endpoint)
        relink(self.cxl_bus / ep_decoder.name, ep_decoder)
        r = devnodes.lowest_free(_numbered(self.cxl_bus, "region"))
        region = root_decoder / f"region{r}"
        _write(
            region,
            {
                "size": f"{memory.size:#x}",
                "mode": "ram",
                "interleave_ways": "1",
                "target0": ep_decoder.name,
                "commit": "1",
                "uuid": str(uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"{memory.serial}/{r}")),
            },
        )
        relink(self.cxl_bus / region.name, region)
        dax = region / f"dax_region{r}" / f"dax{r}.0"
        _write(
            dax,
            {
                "size": str(memory.size),
                "target_node": str(target_node),
                "numa_node": str(numa),
                "align": str(DAX_ALIGN),
                "dev": f"{devnodes.DAX_MAJOR}:{r}",
            },
        )
        self.device_dax.mkdir(parents=True, exist_ok=True)
        relink(dax / "driver", self.device_dax)
        relink(self.device_dax / dax.name, dax)
        relink(self.dax_bus / dax.name, dax)
        devnodes.make_node(self.dev_root, dax.name, "c", devnodes.DAX_MAJOR, r)
        return dax.name

    def memdev_of(self, pci: Path) -> Path | None:
        found = sorted(p for p in pci.glob("mem*") if p.name[3:].isdigit())
        return found[0] if found else None

    def remove(self, pci: Path) -> list[str]:
        """Undo :meth:`add` for the memdev below ``pci``; the names removed."""
        mem = self.memdev_of(pci)
        if mem is None:
            return []
        gone = []
        for endpoint in sorted(self.root0.glob("endpoint*")):
            uport = endpoint / "uport"
            if not uport.is_symlink() or Path(os.path.realpath(uport)) != mem:
                continue
            decoders = {d.name for d in endpoint.glob("decoder*")}
            for region in sorted(self.root0.glob("decoder0.*/region*")):
                if (region / "target0").read_text().strip() not in decoders:
                    continue
                for dax in sorted(region.glob("dax_region*/dax*")):
                    for links in (self.dax_bus, self.device_dax):
                        (links / dax.name).unlink(missing_ok=True)
                    devnodes.remove_node(self.dev_root, dax.name)
                    gone.append(dax.name)
                (self.cxl_bus / region.name).unlink(missing_ok=True)
                shutil.rmtree(region)
                gone.append(region.name)
            for name in (*decoders, endpoint.name):
                (self.cxl_bus / name).unlink(missing_ok=True)
            shutil.rmtree(endpoint)
        (self.cxl_bus / mem.name).unlink(missing_ok=True)
        shutil.rmtree(mem)
        return [*gone, mem.name]
