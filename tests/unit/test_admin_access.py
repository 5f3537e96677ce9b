"""Admin access (``DRAAdminAccess``): a read-only view of a device another
claim holds is prepared without a conflict and without touching the device
(no handler prepare or unprepare, no MIG change, no vfio rebinding), and the
holder and the viewer unprepare independently."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry, ContainerEdits
from driver.checkpoint import CheckpointStore
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.config.opaque import DeviceConfig
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.errors import ClaimError
from driver.vf.prepare import VfHandler
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.claims_doubles import NODE, OnceHandler, Reader
from tests.unit.mig_node import Node

Env = tuple[Reader, OnceHandler, ClaimPreparer, Path]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    inv = NodeInventory()
    devices = [
        Device(name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}", attributes={"minor": i})
        for i in range(2)
    ]
    inv.replace_pool(NODE, devices)
    reader = Reader()
    handler = OnceHandler(tmp_path / "dev")  # refuses to set up a device twice
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(reader, inv, {"gpu": handler}, store, CdiRegistry(tmp_path / "cdi"))
    return reader, handler, prep, tmp_path


def admin_claim(reader: Reader, name: str, device: str) -> ClaimRef:
    ref = reader.add(name, [device])
    claim: dict[str, Any] = reader.claims[("ns", name)]
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    return ref


def spec(tmp: Path, ref: ClaimRef) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (tmp / "cdi" / f"k8s.patchbay.dev-claim_{ref.uid}.json").read_text()
    )
    return loaded


async def test_admin_view_of_a_held_gpu_touches_nothing(env: Env) -> None:
    reader, handler, prep, tmp = env
    holder = reader.add("holder", ["gpu-1"])
    assert (await prep.prepare([holder]))[holder.uid].error == ""
    held_spec = spec(tmp, holder)
    held_record = prep.checkpoint.claims[holder.uid].model_dump()
    viewer = admin_claim(reader, "monitor", "gpu-1")
    assert (await prep.prepare([viewer]))[viewer.uid].error == ""
    assert handler.calls == [("prepare", "GPU-1")], "the view never calls the handler"
    view = spec(tmp, viewer)
    assert view["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-1"]
    assert view["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia1"
    # Unprepare of the view leaves the holder as it was, and the other way round.
    assert (await prep.unprepare([viewer]))[viewer.uid] == ""
    assert handler.calls == [("prepare", "GPU-1")] and handler.active == {"GPU-1"}
    assert spec(tmp, holder) == held_spec
    assert prep.checkpoint.claims[holder.uid].model_dump() == held_record
    assert (await prep.prepare([viewer]))[viewer.uid].error == ""
    assert (await prep.unprepare([holder]))[holder.uid] == ""
    assert handler.active == set()
    assert spec(tmp, viewer) == view and viewer.uid in prep.checkpoint.claims


async def test_without_admin_access_the_held_gpu_is_a_conflict(env: Env) -> None:
    reader, _handler, prep, _ = env
    holder = reader.add("holder", ["gpu-0"])
    await prep.prepare([holder])
    other = reader.add("other", ["gpu-0"])
    assert "already prepared for claim" in (await prep.prepare([other]))[other.uid].error


async def test_a_view_holds_nothing(env: Env) -> None:
    reader, handler, prep, _ = env
    viewer = admin_claim(reader, "monitor", "gpu-0")
    assert (await prep.prepare([viewer]))[viewer.uid].error == ""
    later = reader.add("later", ["gpu-0"])
    assert (await prep.prepare([later]))[later.uid].error == ""
    assert handler.calls == [("prepare", "GPU-0")]


def test_mig_view_finds_the_holders_instance_and_changes_nothing() -> None:
    n = Node()
    name = "gpu-0-mig-3g-40gb-4"
    undo, env = n.prepare(name)
    device = n.devices[name]
    handler: Any = n.handlers[device.kind]
    before = sorted((g.gi_id, g.profile_id, g.start) for g in n.gpu().instances.values())
    view = handler.prepare_admin(device, undo)
    assert [f"{k}={v}" for k, v in view.claim_lists] == env, "the holder's MIG device UUID"
    assert sorted((g.gi_id, g.profile_id, g.start) for g in n.gpu().instances.values()) == before
    n.unprepare(name, undo)
    assert not n.gpu().mig_current
    with pytest.raises(ClaimError, match="not created"):
        handler.prepare_admin(device, None)
    assert n.gpu().instances == {} and not n.gpu().mig_current, "a view never creates one"


def test_vf_view_never_rebinds(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path / "node")
    from driver.pci.writes import driver_of
    from driver.vf.config import PfPoolConfig
    from driver.vf.discovery import scan_vfs

    config = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})
    vf = next(d for d in scan_vfs(host.sysfs_root, config) if d.name == "vf-0000-1a-00-2")
    path = host.sysfs_root / "bus/pci/devices" / vf.local_id
    bound = driver_of(path)
    view = VfHandler(host.sysfs_root, host.dir / "dev").prepare_admin(vf, {"mode": "vfio-pci"})
    assert "PATCHBAY_VF_0000_1A_00_2_PCI_BUS_ID=0000:1a:00.2" in view.edits.env
    assert view.edits.device_nodes == () and view.undo == {}
    assert driver_of(path) == bound


class RecordingSharing:
    """A ClaimSharing that records what it was asked to plan and apply."""

    def __init__(self) -> None:
        self.planned: list[DeviceConfig | None] = []

    def plan(
        self, claim_uid: str, devices: Sequence[tuple[Device, DeviceConfig | None]]
    ) -> list[dict[str, Any]]:
        self.planned += [c for _, c in devices]
        return [{"sharing": {"uuid": d.local_id}} if c else {} for d, c in devices]

    def involved(self, undos: Sequence[Mapping[str, Any]]) -> bool:
        return any("sharing" in u for u in undos)

    def apply(self, claim_uid: str, undos: Sequence[Mapping[str, Any]]) -> ContainerEdits | None:
        assert not any("sharing" in u for u in undos), "a view must not share the GPU"
        return None

    def undo(self, claim_uid: str, undos: Sequence[Mapping[str, Any]]) -> None:
        assert not any("sharing" in u for u in undos), "a view must not undo sharing"


async def test_a_view_takes_no_config_so_no_sharing(tmp_path: Path) -> None:
    inv = NodeInventory()
    inv.replace_pool(NODE, [Device(name="gpu-0", kind="gpu", local_id="GPU-0")])
    reader, sharing = Reader(), RecordingSharing()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(
        reader, inv, {"gpu": OnceHandler(tmp_path / "dev")}, store,
        CdiRegistry(tmp_path / "cdi"), sharing=sharing,
    )  # fmt: skip
    config = {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": "patchbay.dev",
            "parameters": {
                "apiVersion": "patchbay.dev/v1alpha1",
                "kind": "GpuConfig",
                "driverCapabilities": ["compute"],
            },
        },
    }
    viewer = reader.add("monitor", ["gpu-0"], config=[config])
    reader.claims[("ns", "monitor")]["status"]["allocation"]["devices"]["results"][0][
        "adminAccess"
    ] = True
    assert (await prep.prepare([viewer]))[viewer.uid].error == ""
    assert sharing.planned == [None]
    assert (await prep.unprepare([viewer]))[viewer.uid] == ""
