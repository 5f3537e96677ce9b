"""Local GPUs keep their names while fabric GPUs come and go (issue 38).

NVML numbers GPUs in PCI bus order, and a fabric adapter's bus can sit below
a local GPU's: on the GPUDirect board adapter0's first free bus (0x17) is
below every local H100 (0x18, 0x19, 0x88, 0x89). Named by NVML's index, the
attach renamed every local GPU (``gpu-0`` became ``gpu-1``), and with it its
MIG set, its placements, its shared twin, its health record's taint. The
real scan code runs here over the NVML fake and the simulated host's sysfs.
"""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint import Checkpoint
from driver.devices.model import Device
from driver.fabric_devices.node import FabricNodeView, parse_adapters
from driver.gpu.discovery import Place
from driver.gpu.fraction import SharePolicy
from driver.gpu.kind import GpuType
from driver.gpu.scan import SysfsTopology, scan_gpus
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu

FABRIC_GPU = "GPU-0f0b1c2d-3f4a-4b5c-8d6e-7f8091a2b3c4"
ADAPTERS = "adapter0=0000:15:02.0,adapter1=0000:85:02.0"  # the gpu-nvme board's


class Node:
    """The GPUDirect board, NVML (the fake) mirroring its GPUs, dynamic MIG and
    sharing on for every GPU, the plugin's fabric view of its adapters."""

    def __init__(self, tmp: Path) -> None:
        self.host = SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp / "host", "node-c")
        self.machine = FakeMachine()
        self.sync()
        nvml = FakeNvml(self.machine)
        mig = MigSupport(
            NvmlSession(nvml),
            MigPolicy.parse("all", "", True, False),
            lambda s, g: MigHandler(s, g, tmp / "dev"),
            Checkpoint,
        )
        self.view = FabricNodeView("node-c", parse_adapters(ADAPTERS), self.host.sysfs_root)
        self.gpus = GpuType(
            nvml, self.host.sysfs_root, tmp / "dev", mig=mig, events=nvml,
            share=SharePolicy.parse("all", 1024), placement=self.view.place,
        )  # fmt: skip

    def sync(self) -> None:
        """NVML sees what the host's bus holds (as after the driver's probe)."""
        on_bus = {g["uuid"]: g for g in self.host.nvml.read()["gpus"]}
        for uuid in set(self.machine.gpus) - set(on_bus):
            self.machine.remove_gpu(uuid)
        for uuid, g in on_bus.items():
            if uuid not in self.machine.gpus:
                self.machine.add_gpu(uuid, g["model"], g["pci_bus_id"], serial=g["serial"])

    def local_names(self) -> dict[str, set[str]]:
        """GPU UUID -> the names of everything the node's own pool offers of it,
        and the counter sets they draw on."""
        found = self.gpus.discover()
        local, _ = self.view.split(list(found.devices))
        out: dict[str, set[str]] = {}
        for d in local:
            gpu = d.parent or d.local_id
            out.setdefault(gpu, set()).update(
                {d.name, *(c.counter_set for c in d.consumes_counters)}
            )
        return out


def full_gpus(devices: list[Device]) -> dict[str, tuple[str, object]]:
    return {d.local_id: (d.name, d.attributes["index"]) for d in devices if d.kind == "gpu"}


def test_a_fabric_gpu_below_the_local_ones_renames_none_of_them(tmp_path: Path) -> None:
    node = Node(tmp_path)
    before = node.local_names()
    assert len(before) == 4
    named = {uuid: min(names, key=len) for uuid, names in before.items()}
    assert sorted(named.values()) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]

    (bdf,) = node.host.hot_add("adapter0", Gpu(node.host.free_bdf("adapter0"), uuid=FABRIC_GPU))
    node.sync()
    scanned = full_gpus(list(node.gpus.discover().devices))
    # NVML numbers the fabric GPU first (index 0: it sits on the lowest bus).
    assert scanned[FABRIC_GPU] == ("gpu-4", 0)
    assert node.local_names() == before  # names, MIG sets, placements, shares, whole sets
    assert {uuid: name for uuid, (name, _) in scanned.items() if uuid != FABRIC_GPU} == named
    assert {index for uuid, (_, index) in scanned.items() if uuid != FABRIC_GPU} == {1, 2, 3, 4}

    node.host.hot_remove(bdf)
    node.sync()
    assert node.local_names() == before


def test_a_gpu_gone_from_sysfs_is_numbered_last_and_shifts_no_one(tmp_path: Path) -> None:
    machine = FakeMachine()
    model = "H100-SXM5-80GB"
    for uuid, bdf in (
        ("GPU-a", "0000:17:00.0"),
        ("GPU-b", "0000:18:00.0"),
        ("GPU-c", "0000:19:00.0"),
    ):
        machine.add_gpu(uuid, model, bdf)
    places = {"0000:17:00.0": Place.GONE, "0000:18:00.0": Place.FABRIC}
    topology = SysfsTopology(tmp_path, lambda bdf: places.get(bdf, Place.LOCAL))
    names = {d.local_id: d.name for d in scan_gpus(FakeNvml(machine), topology)}
    assert names == {"GPU-c": "gpu-0", "GPU-b": "gpu-1", "GPU-a": "gpu-2"}
    # Without a fabric view every GPU is local: NVML's order.
    plain = {d.local_id: d.name for d in scan_gpus(FakeNvml(machine), SysfsTopology(tmp_path))}
    assert plain == {"GPU-a": "gpu-0", "GPU-b": "gpu-1", "GPU-c": "gpu-2"}
