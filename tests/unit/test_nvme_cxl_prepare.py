"""Preparing NVMe drives and CXL memory on the simulated host: the CDI device nodes
and environment, refusals of a swapped device, and whole claims through the
claim preparer (spec written on prepare, removed on unprepare, also after a
restart that read the checkpoint)."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path

import pytest

from driver.cdi import CdiRegistry, DeviceNode
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.cxl.kind import CxlMemoryType
from driver.cxl.prepare import CxlMemoryHandler
from driver.devices.handler import DeviceHandler
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.errors import DeviceError
from driver.fabric_devices.node import FabricNodeView
from driver.nvme.kind import DriveSelection, NvmeType
from driver.nvme.prepare import NvmeHandler
from fabric.simhost import TOPOLOGIES, CxlMemory, Nvme, SimHost, devnodes
from tests.claims_doubles import NODE, Reader

ADAPTERS = {"adapter0": "0000:15:02.0", "adapter1": "0000:85:02.0"}


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp_path / "node-a", "node-a")


def families(host: SimHost) -> tuple[NvmeType, CxlMemoryType]:
    view = FabricNodeView(NODE, ADAPTERS, host.sysfs_root)
    return (
        NvmeType(DriveSelection.parse("all"), host.sysfs_root, host.dev_root, view.behind_adapter),
        CxlMemoryType(host.sysfs_root, host.dev_root, view.behind_adapter),
    )


def handlers(host: SimHost) -> dict[str, DeviceHandler]:
    out: dict[str, DeviceHandler] = {}
    for family in families(host):
        out.update(family.handlers())
    return out


def devices(host: SimHost) -> dict[str, Device]:
    return {d.name: d for f in families(host) for d in f.discover().devices}


def expected_node(host: SimHost, path: str, kind: str, numbers: tuple[int, int]) -> DeviceNode:
    """The CDI node: numbers from sysfs, the host path only where a real node was made."""
    name = path.removeprefix("/dev/")
    mode = (host.dev_root / name).stat().st_mode
    real = stat.S_ISBLK(mode) if kind == "b" else stat.S_ISCHR(mode)
    return DeviceNode(
        path, *numbers, type=kind, host_path=str(host.dev_root / name) if real else None
    )


def test_a_drive_gets_its_block_and_generic_device_never_the_controller(host: SimHost) -> None:
    drive = devices(host)["nvme-0000-1a-00-0"]
    prep = handlers(host)["nvme"].prepare(drive, str(uuid.uuid4()), None)
    assert prep.edits.device_nodes == (
        expected_node(host, "/dev/nvme0n1", "b", (devnodes.NVME_BLOCK_MAJOR, 0)),
        expected_node(host, "/dev/ng0n1", "c", (devnodes.NVME_GENERIC_MAJOR, 0)),
    )
    assert dict(prep.claim_lists) == {
        "PATCHBAY_NVME_DEVICES": "/dev/nvme0n1",
        "PATCHBAY_NVME_GENERIC_DEVICES": "/dev/ng0n1",
    }
    assert ("PATCHBAY_NVME_SERIAL", "S6CKNT0W700000") in prep.indexed_env


def test_a_swapped_drive_is_refused(host: SimHost) -> None:
    drive = devices(host)["nvme-0000-1a-00-0"]
    (host.sysfs_root / "class" / "nvme" / "nvme0" / "serial").write_text("OTHER\n")
    with pytest.raises(DeviceError, match="serial 'OTHER', published as 'S6CKNT0W700000'"):
        handlers(host)["nvme"].prepare(drive, str(uuid.uuid4()), None)


def test_cxl_memory_gets_its_dax_device(host: SimHost) -> None:
    host.hot_add("adapter0", CxlMemory(host.free_bdf("adapter0"), 0xABCDEF, 64 << 30))
    [memory] = [d for d in devices(host).values() if d.kind == "cxlmem"]
    prep = handlers(host)["cxlmem"].prepare(memory, str(uuid.uuid4()), None)
    assert prep.edits.device_nodes == (
        expected_node(host, "/dev/dax0.0", "c", (devnodes.DAX_MAJOR, 0)),
    )
    assert prep.claim_lists == (("PATCHBAY_CXL_DEVICES", "/dev/dax0.0"),)
    assert dict(prep.indexed_env) == {
        "PATCHBAY_CXL_SIZE": str(64 << 30),
        "PATCHBAY_CXL_NUMA_NODE": "2",  # the window's memory-only node after CPU nodes 0, 1
        "PATCHBAY_CXL_SERIAL": "0xabcdef",
    }


def test_cxl_memory_gone_at_prepare_is_refused(host: SimHost) -> None:
    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", CxlMemory(bdf, 0xABCDEF))
    [memory] = [d for d in devices(host).values() if d.kind == "cxlmem"]
    host.hot_remove(bdf)
    with pytest.raises(DeviceError, match="no devdax device now"):
        handlers(host)["cxlmem"].prepare(memory, str(uuid.uuid4()), None)


def test_cxl_memory_in_use_refuses_a_hot_remove_and_stays(host: SimHost) -> None:
    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", CxlMemory(bdf, 0xABCDEF))
    host.set_memory_in_use(bdf)
    with pytest.raises(DeviceError, match="in use"):
        host.hot_remove(bdf)
    assert (host.sysfs_root / "bus" / "dax" / "devices" / "dax0.0").exists()
    assert (host.dev_root / "dax0.0").exists()
    assert SimHost.open(host.dir).memory_in_use == [bdf]  # kept across opens (the service's)
    host.set_memory_in_use(bdf, False)
    assert host.hot_remove(bdf) == [bdf]
    assert not (host.dev_root / "dax0.0").exists()
    assert not list((host.sysfs_root / "bus" / "cxl" / "devices").glob("mem*"))


async def test_a_claim_of_a_drive_and_cxl_memory_through_the_preparer(
    host: SimHost, tmp_path: Path
) -> None:
    nvme_bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Nvme(nvme_bdf, serial="FAB001"))
    host.hot_add("adapter1", CxlMemory(host.free_bdf("adapter1"), 0xABCDEF, 32 << 30))
    found = devices(host)
    inventory = NodeInventory()
    inventory.replace_pool(NODE, found.values())
    reader = Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    cdi = tmp_path / "cdi"

    def preparer() -> ClaimPreparer:
        return ClaimPreparer(reader, inventory, handlers(host), store, CdiRegistry(cdi))

    claim = reader.add("tier", ["nvme-0000-17-00-0", "cxlmem-0000-87-00-0"])
    results = await preparer().prepare([claim])
    assert results[claim.uid].error == ""
    [spec_file] = list(cdi.glob("*.json"))
    spec = json.loads(spec_file.read_text())
    env = set(spec["containerEdits"]["env"])
    assert {
        "PATCHBAY_NVME_DEVICES=/dev/nvme2n1",
        "PATCHBAY_NVME_GENERIC_DEVICES=/dev/ng2n1",
        "PATCHBAY_NVME_SERIAL_0=FAB001",
        "PATCHBAY_CXL_DEVICES=/dev/dax0.0",
        f"PATCHBAY_CXL_SIZE_0={32 << 30}",
        "PATCHBAY_CXL_NUMA_NODE_0=3",
    } <= env
    paths = {
        n["path"]: n["type"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]
    }
    assert paths == {"/dev/nvme2n1": "b", "/dev/ng2n1": "c", "/dev/dax0.0": "c"}
    # A restarted plugin (a new preparer reading the checkpoint) unprepares it.
    assert (await preparer().unprepare([claim]))[claim.uid] == ""
    assert not list(cdi.glob("*.json"))
    assert "dax0.0" in {p.name for p in host.dev_root.iterdir()}  # the host is as it was


def test_admin_access_views_never_reach_the_holders_data(host: SimHost) -> None:
    host.hot_add("adapter0", CxlMemory(host.free_bdf("adapter0"), 0xABCDEF, 64 << 30))
    found = devices(host)
    drive = NvmeHandler(host.sysfs_root, host.dev_root).prepare_admin(
        found["nvme-0000-1a-00-0"], None
    )
    [ctrl] = drive.edits.device_nodes
    assert (ctrl.path, ctrl.type, ctrl.major) == ("/dev/nvme0", "c", devnodes.NVME_CHAR_MAJOR)
    assert drive.claim_lists == (("PATCHBAY_NVME_ADMIN_DEVICES", "/dev/nvme0"),)
    memory = next(d for d in found.values() if d.kind == "cxlmem")
    view = CxlMemoryHandler(host.sysfs_root, host.dev_root).prepare_admin(memory, None)
    assert view.edits.device_nodes == ()  # no mapping of the holder's memory
    assert ("PATCHBAY_CXL_ADMIN_SIZE", str(64 << 30)) in view.indexed_env
