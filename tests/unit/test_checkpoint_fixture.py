"""The checkpoint and CDI specs of format 1, as the build of issue 17 wrote
them (tests/fixtures/checkpoint-v1), read by today's code: every record as
written, start-up recovery leaves them consistent, a re-save loses nothing,
and every claim can be unprepared from its undo data. Every later format
must keep passing this (docs/design.md, "Upgrades and downgrades")."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint import CheckpointStore, ClaimState
from tests.checkpoint_view import recorded
from tests.upgrade_node import BOOT_ID, CLAIMS, FIXTURE, MIG_GPU_INDEX, UpgradeNode, ref

UID = {name: uid for name, (uid, _, _) in CLAIMS.items()}
COMPLETED = ("whole-gpu", "mig", "vf")


def fixture_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURE / "checkpoint.json").read_text())
    return data


def fixture_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(
        (FIXTURE / "cdi" / f"k8s.patchbay.dev-claim_{UID[name]}.json").read_text()
    )
    return spec


@pytest.fixture
def node(tmp_path: Path) -> Iterator[UpgradeNode]:
    """A node whose disk holds the fixture and whose hardware is in the state
    its records describe (from the raw JSON, not through today's models)."""
    node = UpgradeNode(tmp_path)
    shutil.copyfile(FIXTURE / "checkpoint.json", node.checkpoint_path)
    shutil.copytree(FIXTURE / "cdi", node.cdi_root)
    node.backend.init()
    for record in fixture_data()["claims"].values():
        for dev in record["devices"]:
            undo = dev["undo"]
            if dev["kind"] == "mig":
                node.backend.set_mig_mode(undo["gpu"], True)
                gi = node.backend.create_gpu_instance(undo["gpu"], undo["profileId"], undo["start"])
                node.backend.create_compute_instance(undo["gpu"], gi)
            elif dev["kind"] == "vf":
                path = node.host.tree.path_of(dev["local_id"])
                (path / "driver_override").write_text("vfio-pci\n")
                node.host.tree.unbind(dev["local_id"])
                node.host.tree.bind(dev["local_id"], "vfio-pci")
    node.backend.shutdown()
    with node.host.effects_watcher():
        yield node


def test_every_record_reads_as_written(node: UpgradeNode) -> None:
    store = CheckpointStore(node.checkpoint_path, BOOT_ID)
    cp = store.load()
    assert store.moved_aside is None and cp.version == 1
    assert set(cp.claims) == set(UID.values())
    handlers = node.preparer()._handlers
    for name, (uid, device, _) in CLAIMS.items():
        record = cp.claims[uid]
        assert (record.namespace, record.name, record.uid) == ("upgrade", name, uid)
        assert record.not_understood(handlers) is None
        (dev,) = record.devices
        assert (dev.pool_name, dev.device_name, dev.request_names) == ("node-a", device, ["r"])
        if name in COMPLETED:
            assert record.state is ClaimState.PREPARE_COMPLETED
            assert record.cdi_spec == fixture_spec(name)
            assert dev.cdi_device_ids == [f"k8s.patchbay.dev/claim={uid}-{device}"]
        else:
            assert record.state is ClaimState.PREPARE_STARTED and record.cdi_spec is None
    by_name = {name: cp.claims[uid].devices[0] for name, uid in UID.items()}
    assert by_name["whole-gpu"].kind == "gpu" and by_name["whole-gpu"].undo == {}
    assert by_name["whole-gpu"].local_id == node.gpu_uuid(0)
    mig = by_name["mig"]
    gpu = node.gpu_uuid(MIG_GPU_INDEX)
    assert mig.kind == "mig" and mig.local_id == f"{gpu}:9:4"
    assert {k: mig.undo[k] for k in ("gpu", "profileId", "start", "giId")} == {
        "gpu": gpu, "profileId": 9, "start": 4, "giId": 1,
    }  # fmt: skip
    assert str(mig.undo["migUUID"]).startswith("MIG-")
    for name in ("vf", "interrupted-vf"):
        assert by_name[name].kind == "vf"
        assert (
            by_name[name].undo["driver"] == "mlx5_core" and by_name[name].undo["override"] is None
        )
    assert by_name["vf"].undo["mode"] == "vfio-pci"


def test_a_resave_keeps_every_field(node: UpgradeNode) -> None:
    store = CheckpointStore(node.checkpoint_path, BOOT_ID)
    store.save(store.load())
    assert json.loads(node.checkpoint_path.read_text()) == fixture_data()


async def test_recovery_keeps_it_consistent_and_recreates_a_lost_spec(node: UpgradeNode) -> None:
    specs = {p.name: p.read_bytes() for p in (FIXTURE / "cdi").iterdir()}
    assert await node.preparer().recover() == (0, 0)
    assert {p.name: p.read_bytes() for p in node.cdi_root.iterdir()} == specs
    assert json.loads(node.checkpoint_path.read_text()) == fixture_data()
    lost = node.cdi_root / f"k8s.patchbay.dev-claim_{UID['mig']}.json"
    lost.unlink()
    prep = node.preparer()
    assert await prep.recover() == (1, 0)
    assert json.loads(lost.read_text()) == fixture_spec("mig")
    # The kubelet's retry of a prepared claim is answered from its record.
    results = await prep.prepare([ref(name) for name in COMPLETED])
    for name in COMPLETED:
        (dev,) = results[UID[name]].devices
        assert dev.cdi_device_ids == (f"k8s.patchbay.dev/claim={UID[name]}-{CLAIMS[name][1]}",)


async def test_every_claim_unprepares_from_its_undo_data(node: UpgradeNode) -> None:
    prep = node.preparer()
    await prep.recover()
    gpu = node.gpu_uuid(MIG_GPU_INDEX)
    assert node.machine.gpus[gpu].instances and node.machine.gpus[gpu].mig_current
    results = await prep.unprepare([ref(name) for name in CLAIMS])
    assert results == {uid: "" for uid in UID.values()}
    assert node.machine.gpus[gpu].instances == {} and not node.machine.gpus[gpu].mig_current
    for bdf in ("0000:1a:00.2", "0000:1a:00.3"):
        assert node.host.tree.driver_of(bdf) == "mlx5_core"
        override = (node.host.tree.path_of(bdf) / "driver_override").read_text().strip()
        assert override in ("", "(null)")
    assert recorded(node.checkpoint_path)["claims"] == {}
    assert list(node.cdi_root.glob("*.json")) == []
