"""NVMe drives and CXL memory found in the simulated host's sysfs tree: local drives
by selection, fabric-attached ones into the fabric pool, the Node report's maps,
and the chain from a dax device to its memdev's serial."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from driver.cxl.kind import CxlMemoryType
from driver.cxl.serial import cxl_identity
from driver.devices.inventory import ALIAS
from driver.devices.model import NUMA_NODE, PCIE_ROOT, Device
from driver.fabric_devices.naming import NodeFabric, variant_name
from driver.fabric_devices.node import FabricNodeView
from driver.nvme.kind import DriveSelection, NvmeType
from driver.pci import sysfs
from driver.slices.limits import device_problems
from fabric.simhost import TOPOLOGIES, CxlMemory, Nvme, SimHost
from fabric.simhost.sysfs_tree import relink

ADAPTERS = {"adapter0": "0000:15:02.0", "adapter1": "0000:85:02.0"}
SERIAL = 0x4C1D96FFFEDDD835


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp_path / "node-a", "node-a")


@pytest.fixture
def view(host: SimHost) -> FabricNodeView:
    return FabricNodeView("node-a", ADAPTERS, host.sysfs_root)


def nvme(host: SimHost, selection: str, view: FabricNodeView | None = None) -> list[Device]:
    always = view.behind_adapter if view is not None else None
    found = NvmeType(DriveSelection.parse(selection), host.sysfs_root, host.dev_root, always)
    return list(found.discover().devices)


def cxl(host: SimHost, view: FabricNodeView) -> list[Device]:
    return list(
        CxlMemoryType(host.sysfs_root, host.dev_root, view.behind_adapter).discover().devices
    )


def test_local_drives_share_the_root_of_the_gpus_on_their_switch(host: SimHost) -> None:
    drives = {d.name: d for d in nvme(host, "all")}
    assert sorted(drives) == ["nvme-0000-1a-00-0", "nvme-0000-8a-00-0"]
    drive = drives["nvme-0000-1a-00-0"]
    gpu_root = sysfs.pcie_root(host.sysfs_root, "0000:18:00.0")
    assert drive.kind == "nvme"
    assert drive.attributes[PCIE_ROOT] == gpu_root == "pci0000:15"
    assert drive.attributes[NUMA_NODE] == 0
    assert drive.attributes["serial"] == "S6CKNT0W700000"
    assert drive.attributes["model"] == "SAMSUNG MZWLR3T8HCLS-00A07"
    assert drive.capacity == {"capacity": "3750738264Ki"}  # 3.84 TB in bytes
    assert drives["nvme-0000-8a-00-0"].attributes[NUMA_NODE] == 1


def test_local_drives_are_offered_only_when_selected(host: SimHost) -> None:
    assert nvme(host, "") == []
    assert [d.local_id for d in nvme(host, "S6CKNT0W700001")] == ["0000:8a:00.0"]
    assert [d.local_id for d in nvme(host, "0000:1a:00.0")] == ["0000:1a:00.0"]


def test_a_namespace_size_is_read_in_512_byte_sectors(host: SimHost, view: FabricNodeView) -> None:
    bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Nvme(bdf, serial="FAB-2NS", namespaces=(1 << 40, 1 << 39)))
    ns = host.sysfs_root / "block" / "nvme2n1"
    assert (ns / "size").read_text().strip() == str((1 << 40) // 512)
    [drive] = [d for d in nvme(host, "", view) if d.local_id == bdf]
    assert drive.capacity == {"capacity": "1536Gi"}
    assert drive.attributes["namespaces"] == 2


def test_a_controller_that_is_not_live_is_not_offered(host: SimHost) -> None:
    (host.sysfs_root / "class" / "nvme" / "nvme0" / "state").write_text("resetting\n")
    assert [d.local_id for d in nvme(host, "all")] == ["0000:8a:00.0"]


def test_a_fabric_drive_goes_to_the_fabric_pool_and_the_node_report(
    host: SimHost, view: FabricNodeView
) -> None:
    bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Nvme(bdf, serial="FAB001  "))
    local, fabric = view.split(nvme(host, "all", view))
    assert bdf not in {d.local_id for d in local}  # never a free local drive
    [drive] = fabric
    assert drive.name == variant_name("FAB001", "node-a", "adapter0", "nvme")
    assert drive.name.startswith("fnvme-")
    assert drive.attributes["attachment"] == "fabric"
    assert drive.attributes[PCIE_ROOT] == "pci0000:15"  # the adapter's root
    report = view.report(fabric, held={("nvme", bdf)})
    assert report.nvme == {"FAB001": "adapter0"} and report.busy == {"FAB001"}
    assert report.sees("nvme", "FAB001", "adapter0")


def test_cxl_memory_behind_an_adapter_is_its_dax_device(
    host: SimHost, view: FabricNodeView
) -> None:
    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", CxlMemory(bdf, SERIAL, 64 << 30))
    [memory] = cxl(host, view)
    node = memory.attributes[NUMA_NODE]
    cpulist = host.sysfs_root / "devices" / "system" / "node" / f"node{node}" / "cpulist"
    assert cpulist.read_text().strip() == ""  # a memory-only NUMA node
    assert node not in (0, 1)
    assert memory.kind == "cxlmem"
    assert memory.capacity == {"capacity": "64Gi"}
    assert memory.attributes[PCIE_ROOT] == "pci0000:85"
    assert memory.attributes["serial"] == "0x4c1d96fffeddd835"
    assert memory.attributes["hostNumaNode"] == 1
    _, fabric = view.split([memory])
    key = f"0x4c1d96fffeddd835@{bdf}"  # by its memdev: an MLD's LDs share the serial
    assert fabric[0].name == variant_name(key, "node-a", "adapter1", "cxlmem")
    # Alone with its serial: it answers to the name from the serial too (before LDs).
    old = variant_name("0x4c1d96fffeddd835", "node-a", "adapter1", "cxlmem")
    assert fabric[0].attributes[ALIAS] == old
    assert view.report(fabric).cxlmem == {key: "adapter1"}


def test_cxl_memory_taken_by_kmem_or_interleaved_is_not_offered(
    host: SimHost, view: FabricNodeView
) -> None:
    first, second = host.free_bdf("adapter0"), ""
    host.hot_add("adapter0", CxlMemory(first, SERIAL, 64 << 30))
    second = host.free_bdf("adapter1")
    host.hot_add("adapter1", CxlMemory(second, SERIAL + 1, 32 << 30))
    assert len(cxl(host, view)) == 2
    dax = Path(os.path.realpath(host.sysfs_root / "bus" / "dax" / "devices" / "dax0.0"))
    kmem = host.sysfs_root / "bus" / "dax" / "drivers" / "kmem"
    kmem.mkdir(parents=True)
    relink(dax / "driver", kmem)  # system-RAM mode: no device node for a container
    region = dax.parent.parent
    assert [d.local_id for d in cxl(host, view)] == [second]
    relink(dax / "driver", host.sysfs_root / "bus" / "dax" / "drivers" / "device_dax")
    (region / "interleave_ways").write_text("2\n")
    assert [d.local_id for d in cxl(host, view)] == [second]


def test_cxl_memory_local_to_the_node_is_not_offered(host: SimHost) -> None:
    host.hot_add("adapter0", CxlMemory(host.free_bdf("adapter0"), SERIAL))
    nothing_behind = FabricNodeView("node-a", {}, host.sysfs_root)
    assert cxl(host, nothing_behind) == []


def test_cxl_identity_reads_every_form_of_a_serial() -> None:
    want = "0x4c1d96fffeddd835"
    assert cxl_identity("0x4C1D96FFFEDDD835\n") == want
    assert cxl_identity("4C-1D-96-FF-FE-DD-D8-35:0001") == want  # a GCXLID
    assert cxl_identity(SERIAL) == want
    with pytest.raises(ValueError, match="'LD-1'"):
        cxl_identity("LD-1")


def test_the_node_report_omits_empty_maps_and_reads_back() -> None:
    gpus_only = NodeFabric({"adapter0": "pci0000:15"}, {"GPU-1": "adapter0"})
    assert json.loads(gpus_only.to_annotation()) == {
        "adapters": {"adapter0": "pci0000:15"},
        "gpus": {"GPU-1": "adapter0"},
    }
    full = NodeFabric(
        {"adapter0": "pci0000:15"},
        nvme={"FAB001": "adapter0"},
        cxlmem={"0x4c1d96fffeddd835": "adapter0"},
        busy=frozenset({"FAB001"}),
    )
    node = {"metadata": {"annotations": {"patchbay.dev/fabric": full.to_annotation()}}}
    assert NodeFabric.from_node(node) == full


def test_drives_and_memory_fit_the_slice_limits(host: SimHost, view: FabricNodeView) -> None:
    host.hot_add("adapter0", Nvme(host.free_bdf("adapter0"), serial="S" * 20, model="M" * 40))
    host.hot_add("adapter1", CxlMemory(host.free_bdf("adapter1"), (1 << 64) - 1))
    local, fabric = view.split(nvme(host, "all", view) + cxl(host, view))
    assert len(local) == 2 and len(fabric) == 2
    for device in local + fabric:
        assert device_problems(device) == [], device.name


def test_with_native_multipath_the_namespaces_sit_under_the_subsystem(host: SimHost) -> None:
    ctrl = Path(os.path.realpath(host.sysfs_root / "class" / "nvme" / "nvme0"))
    subsys = host.sysfs_root / "devices" / "virtual" / "nvme-subsystem" / "nvme-subsys0"
    subsys.mkdir(parents=True)
    for name in ("nvme0n1", "ng0n1"):
        (ctrl / name).rename(subsys / name)
    (ctrl / "nvme0c0n1").mkdir()  # the hidden per-path device stays below the controller
    relink(subsys / "nvme0", ctrl)
    relink(host.sysfs_root / "class" / "nvme-subsystem" / "nvme-subsys0", subsys)
    drive = next(d for d in nvme(host, "all") if d.local_id == "0000:1a:00.0")
    assert drive.capacity == {"capacity": "3750738264Ki"}
