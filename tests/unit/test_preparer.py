"""The claim preparer: claim checks, batch isolation, idempotency, conflicts,
rollback on failure and recovery of an interrupted prepare."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry, ContainerEdits
from driver.checkpoint import Checkpoint, CheckpointStore, ClaimState
from driver.claims.lock import ClaimLock
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.config.opaque import DeviceConfig
from driver.devices.handler import Preparation
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from tests.claims_doubles import NODE, FlakyHandler, OnceHandler, Reader


@pytest.fixture
def env(tmp_path: Path) -> tuple[Reader, FlakyHandler, ClaimPreparer, Path]:
    inv = NodeInventory()
    inv.replace_pool(
        NODE,
        [
            Device(name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}", attributes={"minor": i})
            for i in range(3)
        ],
    )
    reader = Reader()
    handler = FlakyHandler(tmp_path / "dev")
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(reader, inv, {"gpu": handler}, store, CdiRegistry(tmp_path / "cdi"))
    return reader, handler, prep, tmp_path


async def test_prepare_and_unprepare_roundtrip(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    reader, _handler, prep, tmp = env
    ref = reader.add("c1", ["gpu-1"])
    res = (await prep.prepare([ref]))[ref.uid]
    assert res.error == ""
    (dev,) = res.devices
    assert dev.device_name == "gpu-1" and dev.pool_name == NODE and dev.request_names == ("req-0",)
    assert dev.cdi_device_ids == (f"k8s.patchbay.dev/claim={ref.uid}-gpu-1",)
    spec = json.loads((tmp / "cdi" / f"k8s.patchbay.dev-claim_{ref.uid}.json").read_text())
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-1"]
    assert "env" not in spec["devices"][0]["containerEdits"]
    assert prep.checkpoint.claims[ref.uid].state is ClaimState.PREPARE_COMPLETED
    # Idempotent: same answer, no second API read.
    reads = reader.reads
    assert (await prep.prepare([ref]))[ref.uid] == res
    assert reader.reads == reads
    assert (await prep.unprepare([ref]))[ref.uid] == ""
    assert (await prep.unprepare([ref]))[ref.uid] == ""
    assert list((tmp / "cdi").glob("*.json")) == []
    assert prep.checkpoint.claims == {}


async def test_listeners_run_after_the_call_returns(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    """``on_change`` (the fabric report, the GPU recovery) runs once the call
    has returned, its answer written, and sees what the call changed."""
    reader, _handler, prep, _ = env
    seen: list[set[tuple[str, str]]] = []
    prep.on_change = lambda: seen.append(prep.prepared_devices())
    ref = reader.add("c1", ["gpu-1"])
    assert (await prep.prepare([ref]))[ref.uid].error == ""
    assert seen == []
    await asyncio.sleep(0)
    assert seen == [{("gpu", "GPU-1")}]
    assert (await prep.unprepare([ref]))[ref.uid] == ""
    assert len(seen) == 1
    await asyncio.sleep(0)
    assert seen == [{("gpu", "GPU-1")}, set()]


async def test_batch_isolates_bad_claims(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    reader, _handler, prep, _ = env
    good = reader.add("good", ["gpu-0"])
    missing_dev = reader.add("nodev", ["gpu-9"])
    other_pool = reader.add("elsewhere", ["gpu-1"], pool="node-b")
    gone = ClaimRef("ns", "gone", str(uuid.uuid4()))
    replaced = reader.add("replaced", ["gpu-2"])
    replaced_ref = ClaimRef("ns", "replaced", str(uuid.uuid4()))
    bad_cfg = reader.add(
        "badcfg",
        ["gpu-2"],
        config=[
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {
                    "driver": "patchbay.dev",
                    "parameters": {
                        "apiVersion": "patchbay.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "driverCapabilitiez": ["x"],
                    },
                },
            }
        ],
    )
    res = await prep.prepare([good, missing_dev, other_pool, gone, replaced_ref, bad_cfg])
    assert res[good.uid].error == "" and res[good.uid].devices
    assert "not on this node" in res[missing_dev.uid].error
    assert "pool node-b" in res[other_pool.uid].error
    assert "not found" in res[gone.uid].error
    assert "replaced" in res[replaced_ref.uid].error and replaced.uid != replaced_ref.uid
    assert "driverCapabilitiez" in res[bad_cfg.uid].error
    assert set(prep.checkpoint.claims) == {good.uid}


async def test_other_drivers_results_ignored_and_unallocated_refused(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    reader, _, prep, _ = env
    foreign = reader.add("foreign", ["gpu-0"], driver="gpu.nvidia.com")
    res = await prep.prepare([foreign])
    assert res[foreign.uid].error == "" and res[foreign.uid].devices == ()
    ref = reader.add("unalloc", [])
    reader.claims[("ns", "unalloc")]["status"] = {}
    assert "not allocated" in (await prep.prepare([ref]))[ref.uid].error


async def test_device_held_by_another_claim_is_refused(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    reader, _, prep, _ = env
    a = reader.add("a", ["gpu-0"])
    b = reader.add("b", ["gpu-0"])
    assert (await prep.prepare([a]))[a.uid].error == ""
    assert f"already prepared for claim {a.uid}" in (await prep.prepare([b]))[b.uid].error


async def test_failure_rolls_back_everything(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    reader, handler, prep, tmp = env
    handler.fail_on = "gpu-1"
    ref = reader.add("two", ["gpu-0", "gpu-1"])
    res = await prep.prepare([ref])
    assert "gpu-1 broke" in res[ref.uid].error
    assert handler.active == set()
    assert prep.checkpoint.claims == {}
    assert not (tmp / "cdi").exists() or list((tmp / "cdi").glob("*.json")) == []


async def test_interrupted_prepare_is_undone_then_redone(tmp_path: Path) -> None:
    inv = NodeInventory()
    inv.replace_pool(NODE, [Device(name="gpu-0", kind="gpu", local_id="GPU-0")])
    reader, hardware = Reader(), OnceHandler(tmp_path / "dev")

    def preparer() -> ClaimPreparer:  # a (re)started plugin process
        store = CheckpointStore(tmp_path / "cp.json", "boot")
        return ClaimPreparer(reader, inv, {"gpu": hardware}, store, CdiRegistry(tmp_path / "cdi"))

    first = preparer()
    ref = reader.add("c", ["gpu-0"])
    assert (await first.prepare([ref]))[ref.uid].error == ""
    # A crash after the hardware changed, before PrepareCompleted: the state on
    # disk says started, the device is still set up.
    first.checkpoint.claims[ref.uid].state = ClaimState.PREPARE_STARTED
    first._store.save(first.checkpoint)
    assert hardware.active == {"GPU-0"}
    again = preparer()
    assert again.checkpoint.claims[ref.uid].state is ClaimState.PREPARE_STARTED
    res = await again.prepare([ref])
    assert res[ref.uid].error == ""
    # Undone (the stale record's device released), then redone.
    assert hardware.calls == [("prepare", "GPU-0"), ("unprepare", "GPU-0"), ("prepare", "GPU-0")]
    assert hardware.active == {"GPU-0"}
    assert again.checkpoint.claims[ref.uid].state is ClaimState.PREPARE_COMPLETED
    assert CdiRegistry(tmp_path / "cdi").claim_uids() == {ref.uid}


async def test_orphan_cdi_specs_are_collected(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    reader, _, prep, tmp = env
    ref = reader.add("c", ["gpu-0"])
    await prep.prepare([ref])
    orphan = str(uuid.uuid4())
    CdiRegistry(tmp / "cdi").write_claim_spec(orphan, [], ContainerEdits())
    assert await prep.recover() == (0, 1)
    assert CdiRegistry(tmp / "cdi").claim_uids() == {ref.uid}


async def test_config_of_wrong_kind_for_device_fails_claim(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    from driver.config import opaque

    class NicConfig(opaque.DeviceConfig):
        device_types = frozenset({"vf"})

    opaque.register_kind(NicConfig)
    try:
        reader, _, prep, _ = env
        ref = reader.add(
            "c",
            ["gpu-0"],
            config=[
                {
                    "source": "FromClass",
                    "opaque": {
                        "driver": "patchbay.dev",
                        "parameters": {"apiVersion": "patchbay.dev/v1alpha1", "kind": "NicConfig"},
                    },
                }
            ],
        )
        err = (await prep.prepare([ref]))[ref.uid].error
        assert "NicConfig" in err and "gpu-0" in err
    finally:
        opaque.KINDS.pop("NicConfig")


async def test_started_state_is_durable_before_hardware_changes(tmp_path: Path) -> None:
    seen: list[str] = []

    class Hardware(FlakyHandler):
        has_side_effects = True

        def prepare(
            self, device: Device, claim_uid: str, config: DeviceConfig | None
        ) -> Preparation:
            on_disk = CheckpointStore(tmp_path / "cp.json", "boot").load()  # as a restart reads
            seen.append(str(on_disk.claims[claim_uid].state))
            return super().prepare(device, claim_uid, config)

    inv = NodeInventory()
    inv.replace_pool(NODE, [Device(name="gpu-0", kind="gpu", local_id="GPU-0")])
    reader = Reader()
    prep = ClaimPreparer(
        reader,
        inv,
        {"gpu": Hardware(tmp_path / "dev")},
        CheckpointStore(tmp_path / "cp.json", "boot"),
        CdiRegistry(tmp_path / "cdi"),
    )
    ref = reader.add("c", ["gpu-0"])
    assert (await prep.prepare([ref]))[ref.uid].error == ""
    assert seen == ["PrepareStarted"]


async def test_shared_checkpoint_is_read_again_only_after_another_process_wrote_it(
    tmp_path: Path,
) -> None:
    inv = NodeInventory()
    inv.replace_pool(
        NODE, [Device(name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}") for i in (0, 1)]
    )
    reader = Reader()
    loads: list[str] = []

    class CountingStore(CheckpointStore):
        def load(self) -> Checkpoint:
            loads.append(self.boot_id)
            return super().load()

    def process() -> ClaimPreparer:  # a plugin pod of a rolling update
        store = CountingStore(tmp_path / "cp.json", "boot")
        handlers = {"gpu": FlakyHandler(tmp_path / "dev")}
        lock = ClaimLock(tmp_path / "prepare.lock")  # taken by both processes
        return ClaimPreparer(reader, inv, handlers, store, CdiRegistry(tmp_path / "cdi"), lock=lock)

    old, new = process(), process()
    a, b = reader.add("a", ["gpu-0"]), reader.add("b", ["gpu-1"])
    loads.clear()
    assert (await old.prepare([a]))[a.uid].error == ""
    assert (await old.prepare([a]))[a.uid].error == ""
    assert loads == [], "its own writes do not make a process read the file again"
    assert (await new.prepare([b]))[b.uid].error == ""
    assert len(loads) == 1  # the new pod reads what the old one wrote
    assert set(new.checkpoint.claims) == {a.uid, b.uid}
    assert (await old.unprepare([a]))[a.uid] == ""
    assert len(loads) == 2 and set(old.checkpoint.claims) == {b.uid}


async def test_the_record_keeps_the_uids_of_the_claims_pods(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path],
) -> None:
    """A share's processes are mapped to its claim by these (driver.idle.shares)."""
    reader, _handler, prep, tmp = env
    ref, other = reader.add("c1", ["gpu-1"]), reader.add("c2", ["gpu-2"])
    reader.claims[("ns", "c1")]["status"]["reservedFor"] = [
        {"resource": "pods", "name": "p2", "uid": "uid-2"},
        {"resource": "pods", "name": "p1", "uid": "uid-1"},
    ]
    await prep.prepare([ref, other])
    stored = CheckpointStore(tmp / "cp.json", "boot").load()  # as a restart reads it
    assert stored.claims[ref.uid].pods == ["uid-1", "uid-2"]
    assert stored.claims[other.uid].pods is None  # reserved for no pod it names


async def test_the_spares_are_opened_while_the_get_is_in_flight(
    env: tuple[Reader, FlakyHandler, ClaimPreparer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, _handler, prep, tmp = env
    first, second = reader.add("c1", ["gpu-1"]), reader.add("c2", ["gpu-2"])
    assert not (await prep.prepare([first]))[first.uid].error  # the CDI directory exists
    opened_in_flight: list[bool] = []
    read = reader.read_claim

    async def slow_read(namespace: str, name: str) -> Any:
        await asyncio.sleep(0)  # the GET in flight: the loop runs what is due
        opened_in_flight.append(prep._files.cdi.spare._held() is not None)
        return await read(namespace, name)

    monkeypatch.setattr(reader, "read_claim", slow_read)
    assert not (await prep.prepare([second]))[second.uid].error
    assert opened_in_flight == [True]
    assert prep._files.cdi.spare._held() is None, "the spec's write used it"
    assert json.loads((tmp / "cdi" / f"k8s.patchbay.dev-claim_{second.uid}.json").read_text())
