"""Dynamic MIG prepare/unprepare against the NVML fake: sequencing, failures,
the full-GPU guard, crash debris and orphans."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.checkpoint import Checkpoint, ClaimRecord, ClaimState, DeviceRecord
from driver.devices.model import Device
from driver.errors import ClaimError, NvmlDeviceError
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler, ci_cap_minor, gi_cap_minor
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from tests.unit.mig_node import UUID, Node


def test_prepare_creates_gi_at_placement_then_unprepare_ends_mig_mode() -> None:
    n = Node()
    assert not n.gpu().mig_current
    undo_a, env_a = n.prepare("gpu-0-mig-3g-40gb-4")
    assert n.gpu().mig_current, "Hopper: first partition switches MIG mode on"
    undo_b, env_b = n.prepare("gpu-0-mig-1g-10gb-2")
    placed = sorted((g.profile_id, g.start, g.size) for g in n.gpu().instances.values())
    assert placed == [(9, 4, 4), (19, 2, 1)]
    mig_uuids = {e.split("=", 1)[1] for e in env_a + env_b}
    assert len(mig_uuids) == 2 and all(u.startswith("MIG-") for u in mig_uuids)
    assert undo_a["gpu"] == UUID and undo_a["profileId"] == 9 and undo_a["start"] == 4
    n.unprepare("gpu-0-mig-3g-40gb-4", undo_a)
    assert [g.start for g in n.gpu().instances.values()] == [2] and n.gpu().mig_current
    n.unprepare("gpu-0-mig-1g-10gb-2", undo_b)
    n.unprepare("gpu-0-mig-1g-10gb-2", undo_b)  # idempotent
    assert n.gpu().instances == {} and not n.gpu().mig_current


@pytest.mark.parametrize(
    "function", ["nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance"]
)
def test_gi_or_ci_failure_leaves_nothing(function: str) -> None:
    n = Node()
    n.machine.inject_failure(function, "INSUFFICIENT_RESOURCES", gpu=UUID)
    device = n.devices["gpu-0-mig-2g-20gb-0"]
    handler = n.handlers["mig"]
    undo = handler.plan_undo(device)
    with pytest.raises(NvmlDeviceError):
        handler.prepare(device, "claim", None)
    assert n.gpu().instances == {}
    handler.unprepare("mig", device.local_id, undo)  # the preparer's rollback
    assert n.gpu().instances == {} and not n.gpu().mig_current
    n.prepare("gpu-0-mig-2g-20gb-0")  # the failure was one-shot: a retry works
    assert [g.start for g in n.gpu().instances.values()] == [0]


def test_half_created_gi_is_found_and_destroyed_from_planned_undo() -> None:
    n = Node()
    device = n.devices["gpu-0-mig-1g-20gb-6"]
    undo = n.handlers["mig"].plan_undo(device)
    # A crash between GI and CI: only what plan_undo knew is checkpointed.
    n.machine.gpus[UUID].mig_current = True
    backend = FakeNvml(n.machine)
    backend.init()
    backend.create_gpu_instance(UUID, 15, 6)
    assert [g.cis for g in n.gpu().instances.values()] == [{}]
    n.handlers["mig"].unprepare("mig", device.local_id, undo)
    assert n.gpu().instances == {} and not n.gpu().mig_current


def test_debris_at_the_placement_is_replaced_on_prepare() -> None:
    n = Node(mig=True)
    backend = FakeNvml(n.machine)
    backend.init()
    backend.create_gpu_instance(UUID, 14, 2)  # GI without CI, no record owns it
    n.prepare("gpu-0-mig-2g-20gb-2")
    (gi,) = n.gpu().instances.values()
    assert gi.start == 2 and len(gi.cis) == 1


def test_full_gpu_and_partitions_exclude_each_other() -> None:
    n = Node()
    undo, _ = n.prepare("gpu-0-mig-1g-10gb-0")
    with pytest.raises(ClaimError, match="MIG"):
        n.prepare("gpu-0")
    n.unprepare("gpu-0-mig-1g-10gb-0", undo)
    _, env = n.prepare("gpu-0")
    assert env == [f"NVIDIA_VISIBLE_DEVICES={UUID}"] and not n.gpu().mig_current
    with pytest.raises(ClaimError, match="held whole"):
        n.prepare("gpu-0-mig-7g-80gb-0")
    n.unprepare("gpu-0", {})
    n.prepare("gpu-0-mig-7g-80gb-0")
    assert n.gpu().mig_current


def test_full_gpu_claim_switches_idle_mig_mode_off() -> None:
    n = Node(mig=True)
    n.prepare("gpu-1")
    assert not n.gpu("GPU-0001").mig_current and n.gpu().mig_current


def test_ampere_mig_mode_is_never_toggled() -> None:
    n = Node("A100-SXM4-80GB", mig=True)
    undo, _ = n.prepare("gpu-0-mig-4g-40gb-0")
    n.unprepare("gpu-0-mig-4g-40gb-0", undo)
    assert n.gpu().instances == {} and n.gpu().mig_current and n.gpu().mig_pending


def record(kind: str, local_id: str) -> ClaimRecord:
    dev = DeviceRecord(request_names=["r"], pool_name="p", device_name="d", kind=kind,
                       local_id=local_id)  # fmt: skip
    return ClaimRecord(uid="u", namespace="n", name="c", state=ClaimState.PREPARE_STARTED,
                       devices=[dev])  # fmt: skip


@pytest.mark.parametrize("cleanup", [False, True])
def test_orphans_reported_and_destroyed_only_with_cleanup(cleanup: bool) -> None:
    machine = FakeMachine()
    machine.add_gpu(UUID, "H100-SXM5-80GB", "0000:10:00.0", mig=True)
    backend = FakeNvml(machine)
    backend.init()
    backend.create_compute_instance(UUID, backend.create_gpu_instance(UUID, 9, 0))  # claimed
    backend.create_compute_instance(UUID, backend.create_gpu_instance(UUID, 19, 5))  # orphan
    backend.create_gpu_instance(UUID, 19, 6)  # orphan, half-created
    checkpoint = Checkpoint(claims={"u": record("mig", f"{UUID}:9:0")})
    support = MigSupport(
        NvmlSession(FakeNvml(machine)),
        MigPolicy.parse("all", "", True, cleanup),
        lambda s, g: MigHandler(s, g, Path("/nonexistent")),
        lambda: checkpoint,
    )
    GpuType(FakeNvml(machine), Path("/x"), Path("/x"), mig=support).discover()
    left = sorted(g.start for g in machine.gpus[UUID].instances.values())
    assert left == ([0] if cleanup else [0, 5, 6])


def test_full_gpu_holders_are_seeded_from_the_checkpoint() -> None:
    n = Node(checkpoint=Checkpoint(claims={"u": record("gpu", UUID)}))
    with pytest.raises(ClaimError, match="held whole"):
        n.prepare("gpu-0-mig-1g-10gb-0")


def test_capability_minors_follow_the_mig_minors_layout() -> None:
    # /proc/driver/nvidia-caps/mig-minors: gpu0/gi1/access 12, gpu0/gi1/ci0/access 13,
    # gpu1/gi0/access 138.
    assert gi_cap_minor(0, 1) == 12 and ci_cap_minor(0, 1, 0) == 13 and gi_cap_minor(1, 0) == 138


def test_device_nodes_and_common_edits(tmp_path: Path) -> None:
    n = Node()
    handler = MigHandler(n.support.session, n.support.guard, tmp_path)
    device: Device = n.devices["gpu-1-mig-1g-10gb-0"]
    prep = handler.prepare(device, "claim", None)
    assert [x.path for x in prep.edits.device_nodes] == ["/dev/nvidia1"]
    assert prep.edits.device_nodes[0].major == 195
    common = handler.common_edits()
    assert common is not None and "/dev/nvidiactl" in {x.path for x in common.device_nodes}


def nvml_calls(machine: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every NVML function the fake is asked for from now on (its failure hook)."""
    calls: list[str] = []
    take = machine.take_failure

    def record(function: str, uuid: str | None) -> object:
        calls.append(function)
        return take(function, uuid)

    monkeypatch.setattr(machine, "take_failure", record)
    return calls


def test_mig_prepare_and_full_gpu_acquire_look_the_gpu_up_by_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = Node()
    calls = nvml_calls(n.machine, monkeypatch)
    undo, _ = n.prepare("gpu-0-mig-1g-10gb-6")
    n.unprepare("gpu-0-mig-1g-10gb-6", undo)
    n.handlers["gpu"].prepare(n.devices["gpu-1"], "claim", None)
    assert "nvmlDeviceGetCount_v2" not in calls, "no enumeration of every GPU"
    assert calls.count("nvmlDeviceGetHandleByUUID") >= 3


def test_a_scan_enumerates_nvml_once(monkeypatch: pytest.MonkeyPatch) -> None:
    n = Node()
    calls = nvml_calls(n.machine, monkeypatch)
    n.type.discover()
    assert calls.count("nvmlDeviceGetCount_v2") == 1
    assert calls.count("nvmlDeviceGetHandleByIndex_v2") == 2  # one per GPU
