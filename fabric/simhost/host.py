"""A simulated host: sysfs tree, NVML mock state and hot-plug feed together.

``SimHost.build(topology, dir)`` lays out, under ``dir``:

    sys/                 the sysfs root (pass it as the driver's sysfs root)
    dev/                 device nodes of NVMe drives and CXL dax devices (--dev-root)
    nvml-state.json      the C mock's state (``PATCHBAY_NVML_STATE``)
    uevents.jsonl        hot-plug events (``driver.pci.uevents.UeventFeed``)
    host.json            what ``SimHost.open(dir)`` needs to carry on
    bin/                 stand-ins of NVIDIA's tools: ``nvidia-smi`` (records
                         time-slice changes in nvidia-smi.json) and
                         ``nvidia-cuda-mps-control`` (an MPS control daemon)

Hot-add/remove keep the three in step, in the order a real host shows them:
the device (and its NVML entry) exists before its ``add`` event, and is gone
before its ``remove`` event. NVMe drives (``nvme_sysfs``) and CXL memory
(``cxl_sysfs``) also get their class, block and dax entries and ``/dev``
nodes; a CXL memory device marked in use (:meth:`set_memory_in_use`, as when
its pages are pinned) refuses a hot-remove with a ``DeviceError`` and stays
as it was. Writes to ``bind``/``unbind``/``drivers_probe``
take effect through :meth:`process_writes` or :meth:`effects_watcher` (see
``effects.py``); a GPU leaves the NVML state while NVIDIA's driver does not
hold it (bound to ``vfio-pci`` for a VM) and comes back when it does.
Every change takes the host lock (``hostlock.py``), which the effects step
takes too, so the fabric service's process, the effects watcher and a test
may act on one host at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import tempfile
import uuid as uuidlib
from pathlib import Path

from driver.errors import DeviceError
from fabric.simhost import violations
from fabric.simhost.cxl_sysfs import CxlSysfs
from fabric.simhost.effects import EffectsWatcher, SysfsEffects
from fabric.simhost.hostlock import HostLock
from fabric.simhost.nvme_sysfs import NvmeSysfs, derived_serial
from fabric.simhost.nvml_state import STATE_ENV, NvmlStateFile, empty_state, gpu_entry
from fabric.simhost.sysfs_tree import (
    CLASS_BRIDGE,
    CLASS_CXL_MEMORY,
    CLASS_GPU,
    CLASS_NVME,
    NVIDIA,
    PCI_DEVICE_IDS,
    PciFunction,
    SysfsTree,
)
from fabric.simhost.topology import (
    CxlMemory,
    Gpu,
    Nic,
    Nvme,
    RootPort,
    Switch,
    Topology,
    bdf_parts,
)
from fabric.simhost.uevents import UeventEmitter

log = logging.getLogger(__name__)

_NS = uuidlib.UUID("6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e10")
CPUS_PER_NODE = 32
# PCI ids of the simulated drives and memory expanders (Samsung).
NVME_IDS = (0x144D, 0xA824)
CXL_IDS = (0x144D, 0xA800)
Endpoint = Gpu | Nic | Nvme | CxlMemory


class SimHost:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.sysfs_root = directory / "sys"
        self.nvml_state_path = directory / "nvml-state.json"
        self.uevent_path = directory / "uevents.jsonl"
        self.tree = SysfsTree(self.sysfs_root)
        self.nvml = NvmlStateFile(self.nvml_state_path)
        self.events = UeventEmitter(self.uevent_path)
        self.dev_root = directory / "dev"
        self.nvme = NvmeSysfs(self.sysfs_root, self.dev_root)
        self.cxl = CxlSysfs(self.sysfs_root, self.dev_root)
        self.name = directory.name
        self.adapters: dict[str, list[str | int]] = {}
        self.native: dict[str, str] = {}
        self.next_minor = 0
        self.memory_in_use: list[str] = []
        self._load()
        # Every change to the tree, the NVML state and host.json, by whichever
        # process or thread, happens under it (hostlock.py says why).
        self.lock = HostLock(directory, on_acquire=self._load)
        self.effects = SysfsEffects(
            self.tree, self.native_driver, self._driver_changed, lock=self.lock
        )

    def _load(self) -> None:
        """Read host.json again: another process may have changed the host."""
        meta = self.dir / "host.json"
        data = json.loads(meta.read_text()) if meta.exists() else {}
        self.name = data.get("name", self.name)
        self.adapters = data.get("adapters", self.adapters)
        self.native = data.get("native", self.native)
        self.next_minor = data.get("next_minor", self.next_minor)
        self.memory_in_use = data.get("memory_in_use", self.memory_in_use)

    # ---- construction ----------------------------------------------------------

    @classmethod
    def build(cls, topology: Topology, directory: Path, name: str = "") -> SimHost:
        directory.mkdir(parents=True, exist_ok=True)
        host = cls(directory)
        host.name = name or directory.name
        host.tree.skeleton()
        host.nvml.update(lambda s: s.update(empty_state()))
        host.cxl.cpu_nodes(CPUS_PER_NODE, {rc.numa_node for rc in topology.roots})
        for rc in topology.roots:
            parent = host.tree.root_complex(rc.name)
            for port in rc.ports:
                host._add_port(parent, port, rc.numa_node)
        host._save()
        host._write_tools()
        log.info("simulated host %s built in %s", host.name, directory)
        return host

    @classmethod
    def open(cls, directory: Path) -> SimHost:
        if not (directory / "host.json").exists():
            raise FileNotFoundError(f"{directory} holds no simulated host")
        return cls(directory)

    def _save(self) -> None:
        data = {
            "name": self.name,
            "adapters": self.adapters,
            "native": self.native,
            "next_minor": self.next_minor,
            "memory_in_use": self.memory_in_use,
        }
        tmp = self.dir / "host.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.dir / "host.json")  # a reader outside the lock sees old or new

    def _bridge(self, parent: Path, bdf: str, numa: int, vendor: int, device: int) -> Path:
        self.native[bdf] = "pcieport"
        return self.tree.add_function(
            parent, PciFunction(bdf, vendor, device, CLASS_BRIDGE, numa, "pcieport")
        )

    def _add_port(self, parent: Path, port: RootPort, numa: int) -> None:
        path = self._bridge(parent, port.bdf, numa, 0x8086, 0x347A)
        if port.adapter:
            self.adapters[port.adapter] = [port.bdf, numa]
        child = port.child
        if isinstance(child, Switch):
            sw = self._bridge(path, child.bdf, numa, 0x1000, 0xC010)
            for dev in child.devices:
                self._add_endpoint(sw, dev, numa)
        elif child is not None:
            self._add_endpoint(path, child, numa)

    def _add_endpoint(self, parent: Path, dev: Endpoint, numa: int) -> list[str]:
        # Each function is laid out whole (with its class, block and dax
        # entries) before its bus link appears: a reader sees it in one step.
        if isinstance(dev, Nvme):
            fn = PciFunction(dev.bdf, *NVME_IDS, CLASS_NVME, numa, "nvme", NVME_IDS)
            path = self.tree.add_function(parent, fn, publish=False)
            self.native[dev.bdf] = "nvme"
            serial = dev.serial or derived_serial(f"{self.name}/{dev.bdf}")
            self.nvme.add(path, dev, serial, numa)
            self.tree.publish(dev.bdf, path)
            return [dev.bdf]
        if isinstance(dev, CxlMemory):
            behind = [a for a, (port, _) in self.adapters.items() if str(port) in parent.parts]
            if not behind:  # memory pools arrive through a fabric adapter's window
                raise ValueError(f"CXL memory {dev.bdf} must sit behind a fabric adapter")
            fn = PciFunction(dev.bdf, *CXL_IDS, CLASS_CXL_MEMORY, numa, "cxl_pci", CXL_IDS)
            path = self.tree.add_function(parent, fn, publish=False)
            self.native[dev.bdf] = "cxl_pci"
            self.cxl.add(path, dev, numa, window=sorted(self.adapters).index(behind[0]))
            self.tree.publish(dev.bdf, path)
            return [dev.bdf]
        if isinstance(dev, Nic):
            bdfs = self.tree.add_nic(parent, dev, numa)
            self.native.update({b: dev.driver for b in bdfs})
            return bdfs
        device_id, subsystem = PCI_DEVICE_IDS[dev.model]
        fn = PciFunction(dev.bdf, NVIDIA, device_id, CLASS_GPU, numa, "nvidia", (NVIDIA, subsystem))
        self.tree.add_function(parent, fn)
        self.native[dev.bdf] = "nvidia"
        uid = dev.uuid or f"GPU-{uuidlib.uuid5(_NS, f'{self.name}/{dev.bdf}')}"
        serial = dev.serial or f"165{uuidlib.UUID(uid[4:]).int % 10**10:010d}"
        self.nvml.add_gpu(gpu_entry(uid, dev.model, dev.bdf, serial, self.next_minor))
        self.next_minor += 1
        return [dev.bdf]

    def _write_tools(self) -> None:
        """The stand-ins run as plain scripts (stdlib only: no package import)."""
        here = Path(__file__).resolve().parent
        self.bin_dir.mkdir(exist_ok=True)
        tools = {
            self.nvidia_smi: f'"{here / "nvidia_smi.py"}" --host "{self.dir}"',
            self.mps_control: f'"{here / "mps_control.py"}"',
        }
        for path, script in tools.items():
            path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S {script} "$@"\n')
            path.chmod(0o755)

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def nvidia_smi(self) -> Path:
        return self.bin_dir / "nvidia-smi"

    @property
    def mps_control(self) -> Path:
        return self.bin_dir / "nvidia-cuda-mps-control"

    @property
    def mps_root(self) -> Path:
        """Short, outside the host directory: a claim's pipe socket must fit a
        Unix socket path (107 bytes) with the claim UID in it."""
        digest = hashlib.sha1(str(self.dir.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"pb-mps-{digest}"

    def tool_args(self) -> tuple[str, ...]:
        """The plugin flags that point it at this host's stand-ins."""
        return (
            f"--nvidia-smi={self.nvidia_smi}",
            f"--mps-control={self.mps_control}",
            f"--mps-root={self.mps_root}",
        )

    # ---- queries ---------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment a process needs to see this host's GPUs through the C mock."""
        return {STATE_ENV: str(self.nvml_state_path)}

    def native_driver(self, bdf: str) -> str | None:
        physfn = self.tree.bus_devices / bdf / "physfn"
        if bdf not in self.native and physfn.is_symlink():
            # A VF created later through sriov_numvfs: its PF's driver.
            return self.native.get(Path(os.path.realpath(physfn)).name)
        return self.native.get(bdf)

    def _driver_changed(self, bdf: str, driver: str | None) -> None:
        """NVML lists a GPU only while NVIDIA's driver holds it (passthrough)."""
        if self.native.get(bdf) == "nvidia":
            self.nvml.set_visible(bdf, driver == "nvidia")

    def gpu_uuids(self) -> dict[str, str]:
        """PCI address -> NVML UUID of every GPU in the NVML state."""
        return {g["pci_bus_id"]: g["uuid"] for g in self.nvml.read()["gpus"]}

    def devpath(self, bdf: str) -> str:
        return "/" + os.path.relpath(self.tree.path_of(bdf), self.sysfs_root)

    def free_bdf(self, adapter: str) -> str:
        """The next free address behind ``adapter`` (bus numbers above the port's)."""
        port_bdf = str(self.adapters[adapter][0])
        dom, bus, _, _ = bdf_parts(port_bdf)
        for b in range(bus + 1, 256):
            bdf = f"{dom:04x}:{b:02x}:00.0"
            if not self.tree.exists(bdf):
                return bdf
        raise RuntimeError(f"no free bus behind {adapter}")

    # ---- hot-plug ----------------------------------------------------------------

    def _ids(self, bdf: str) -> tuple[str, str]:
        """(PCI_ID, PCI_CLASS) as the kernel formats them: ("10DE:2330", "30200")."""
        base = self.tree.bus_devices / bdf
        vendor, device, klass = (
            int((base / f).read_text(), 16) for f in ("vendor", "device", "class")
        )
        return f"{vendor:04X}:{device:04X}", f"{klass:X}"

    def hot_add(self, adapter: str, device: Endpoint) -> list[str]:
        """Attach a device behind a fabric adapter; returns the BDFs that appeared.

        The one entry point for every kind (GPU, NIC, NVMe drive, CXL memory):
        the device's sysfs and /dev entries exist before its ``add`` uevent,
        and appear in one step under the host lock. A NIC arrives as a real
        PF does, with no VFs (``sriov_numvfs`` 0), whatever ``num_vfs`` says:
        the node's driver makes them."""
        if isinstance(device, Nic):
            device = dataclasses.replace(device, num_vfs=0)
        with self.lock:
            port_bdf, numa = self.adapters[adapter]
            parent = self.tree.path_of(str(port_bdf))
            bdfs = self._add_endpoint(parent, device, int(numa))
            self._save()
            for bdf in bdfs:
                self.events.emit("add", self.devpath(bdf), bdf, *self._ids(bdf))
        return bdfs

    def set_memory_in_use(self, bdf: str, in_use: bool = True) -> None:
        """Mark the CXL memory device at ``bdf`` in use (its pages pinned, as by a
        running process): :meth:`hot_remove` then refuses it. False clears the mark."""
        with self.lock:
            if not self.tree.exists(bdf) or self.cxl.memdev_of(self.tree.path_of(bdf)) is None:
                raise DeviceError(f"{bdf} on {self.name} is not a CXL memory device")
            marks = set(self.memory_in_use)
            marks = marks | {bdf} if in_use else marks - {bdf}
            self.memory_in_use = sorted(marks)
            self._save()

    def hot_remove(self, bdf: str) -> list[str]:
        """Detach a device (with its VFs); returns the BDFs that went away.

        Functions already gone are no error: a remove that is run again (an
        attach rolled back after it failed half-way) removes what is left.
        Raises ``DeviceError`` (nothing changed) for CXL memory in use."""
        with self.lock:
            return self._hot_remove(bdf)

    def _hot_remove(self, bdf: str) -> list[str]:
        if bdf in self.memory_in_use and self.tree.exists(bdf):
            raise DeviceError(
                f"CXL memory {bdf} on {self.name} is in use (its memory cannot be "
                "offlined while pages are pinned): not removed"
            )
        pf = self.tree.path_of(bdf)
        vfs = sorted(Path(os.path.realpath(p)).name for p in pf.glob("virtfn*"))
        gone = [b for b in (*vfs, bdf) if self.tree.exists(b)]
        info = {b: (self.devpath(b), *self._ids(b)) for b in gone}
        uuid = self.gpu_uuids().get(bdf)
        if uuid:
            # Not refused, as on a real host (XID 79), but recorded: tests fail on it.
            violations.record_gpu_removal(self.dir, self.name, bdf, self.nvml.read())
            self.nvml.remove_gpu(uuid)
        self.nvme.remove(pf)
        self.cxl.remove(pf)
        for b in vfs:
            self.tree.remove_function(b)
        self.tree.remove_function(bdf)
        for b in (*vfs, bdf):
            self.native.pop(b, None)
            if b in self.memory_in_use:
                self.memory_in_use.remove(b)
        for b in gone:
            devpath, pci_id, pci_class = info[b]
            self.events.emit("remove", devpath, b, pci_id, pci_class)
        self._save()
        return gone

    # ---- sysfs write effects -------------------------------------------------------

    def process_writes(self) -> int:
        """Apply pending driver_override/bind/unbind/drivers_probe writes now."""
        return self.effects.apply()

    def effects_watcher(self, safety_s: float = 1.0) -> EffectsWatcher:
        """A thread applying writes as they land (use as a context manager)."""
        return EffectsWatcher(self.effects, safety_s)
