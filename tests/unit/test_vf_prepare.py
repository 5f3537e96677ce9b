"""Preparing VFs on the simulated tree: netdev mode, the vfio-pci rebinding
sequence and its undo, and VF claims through the claim preparer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.config import opaque
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.errors import DeviceError
from driver.vf.config import PfPoolConfig, VfConfig
from driver.vf.discovery import scan_vfs
from driver.vf.prepare import VfHandler
from fabric.simhost.effects import EffectsWatcher
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.checkpoint_view import recorded
from tests.claims_doubles import Reader

VFIO = VfConfig.model_validate(
    {"apiVersion": opaque.API_VERSION, "kind": "VfConfig", "mode": "vfio-pci"}
)


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path / "node")


@pytest.fixture
def kernel(host: SimHost) -> Iterator[EffectsWatcher]:
    with host.effects_watcher() as watcher:
        yield watcher


@pytest.fixture
def vfs(host: SimHost) -> dict[str, Device]:
    config = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})
    return {d.name: d for d in scan_vfs(host.sysfs_root, config)}


def handler(host: SimHost, timeout: float = 5.0) -> VfHandler:
    return VfHandler(host.sysfs_root, host.dir / "dev", timeout=timeout)


def test_netdev_mode_changes_nothing_and_names_the_interface(
    host: SimHost, vfs: dict[str, Device]
) -> None:
    vf = vfs["vf-0000-1a-00-2"]
    h = handler(host)
    undo = h.plan_undo(vf)
    prep = h.prepare(vf, str(uuid.uuid4()), None)
    assert set(prep.edits.env) == {
        "PATCHBAY_VF_0000_1A_00_2_PCI_BUS_ID=0000:1a:00.2",
        "PATCHBAY_VF_0000_1A_00_2_MODE=netdev",
        "PATCHBAY_VF_0000_1A_00_2_NETDEV=ens0f0np0v0",
    }
    assert prep.edits.device_nodes == ()
    assert host.tree.driver_of("0000:1a:00.2") == "mlx5_core"
    h.unprepare("vf", vf.local_id, {**undo, **prep.undo})
    assert host.tree.driver_of("0000:1a:00.2") == "mlx5_core"


def test_vfio_binds_then_restores_the_original_driver(
    host: SimHost, vfs: dict[str, Device], kernel: EffectsWatcher
) -> None:
    h = handler(host)
    for name in ("vf-0000-1a-00-2", "vf-0000-1a-00-3"):  # 1st via drivers_probe, 2nd via bind
        vf = vfs[name]
        path = host.tree.path_of(vf.local_id)
        undo = h.plan_undo(vf)
        assert undo == {"driver": "mlx5_core", "override": None}
        prep = h.prepare(vf, str(uuid.uuid4()), VFIO)
        assert host.tree.driver_of(vf.local_id) == "vfio-pci"
        assert (path / "driver_override").read_text().strip() == "vfio-pci"
        group = (path / "iommu_group").resolve().name
        nodes = {n.path: n for n in prep.edits.device_nodes}
        assert set(nodes) == {f"/dev/vfio/{group}", "/dev/vfio/vfio"}
        assert (nodes["/dev/vfio/vfio"].major, nodes["/dev/vfio/vfio"].minor) == (10, 196)
        assert nodes[f"/dev/vfio/{group}"].minor == int(group)
        assert f"PATCHBAY_{name.upper().replace('-', '_')}_VFIO_GROUP={group}" in prep.edits.env
        h.prepare(vf, str(uuid.uuid4()), VFIO)  # already bound: a no-op
        h.unprepare("vf", vf.local_id, {**undo, **prep.undo})
        assert host.tree.driver_of(vf.local_id) == "mlx5_core"
        assert (path / "driver_override").read_text().strip() in ("", "(null)")
        h.unprepare("vf", vf.local_id, {**undo, **prep.undo})  # idempotent
        assert host.tree.driver_of(vf.local_id) == "mlx5_core"


def test_vfio_without_iommu_group_is_refused_untouched(
    host: SimHost, vfs: dict[str, Device], kernel: EffectsWatcher
) -> None:
    vf = vfs["vf-0000-1a-00-2"]
    (host.tree.path_of(vf.local_id) / "iommu_group").unlink()
    with pytest.raises(DeviceError, match="has no IOMMU group"):
        handler(host).prepare(vf, str(uuid.uuid4()), VFIO)
    assert host.tree.driver_of(vf.local_id) == "mlx5_core"


def test_a_bind_that_never_happens_times_out_naming_the_driver(
    host: SimHost, vfs: dict[str, Device]
) -> None:
    # No kernel effects at all: the unbind write is never acted on.
    with pytest.raises(DeviceError, match=r"timed out .* 0000:1a:00\.2 to unbind from mlx5_core"):
        handler(host, timeout=0.1).prepare(vfs["vf-0000-1a-00-2"], str(uuid.uuid4()), VFIO)


def claim_config(**params: object) -> list[dict[str, Any]]:
    body = {"apiVersion": opaque.API_VERSION, "kind": "VfConfig", **params}
    return [{"source": "FromClaim", "opaque": {"driver": "patchbay.dev", "parameters": body}}]


async def test_preparer_batch_vfio_and_malformed_config(
    host: SimHost, vfs: dict[str, Device], kernel: EffectsWatcher, tmp_path: Path
) -> None:
    inv = NodeInventory()
    inv.replace_pool("node", vfs.values())
    reader = Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(reader, inv, {"vf": handler(host)}, store, CdiRegistry(tmp_path / "cdi"))
    good = reader.add(
        "good", {"nic": ["vf-0000-1a-00-2"]}, pool="node", config=claim_config(mode="vfio-pci")
    )
    bad = reader.add(
        "bad", {"nic": ["vf-0000-1a-00-3"]}, pool="node", config=claim_config(mode="vfio", vlan=4)
    )
    results = await prep.prepare([good, bad])
    assert results[good.uid].error == ""
    assert "field mode" in results[bad.uid].error and "field vlan" in results[bad.uid].error
    assert host.tree.driver_of("0000:1a:00.2") == "vfio-pci"
    assert host.tree.driver_of("0000:1a:00.3") == "mlx5_core"
    saved = recorded(tmp_path / "cp.json")  # the file, its journal replayed
    assert saved["claims"][good.uid]["devices"][0]["undo"]["driver"] == "mlx5_core"
    assert bad.uid not in saved["claims"]
    assert (await prep.unprepare([good]))[good.uid] == ""
    assert host.tree.driver_of("0000:1a:00.2") == "mlx5_core"
