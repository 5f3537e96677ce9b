"""GpuConfig.sharing through the real preparer, the simulated host's real
stand-ins (``nvidia-smi``, ``nvidia-cuda-mps-control`` as processes) and the
NVML fake: CDI edits per strategy, the time-slice set and reset, compute
mode EXCLUSIVE_PROCESS and back, one MPS daemon per claim that outlives a
plugin restart (a new preparer from the same disk adopts it) and stops with
the last unprepare, a crash at every step converging, and bad input failing
only its own claim with the field named."""

from __future__ import annotations

import json
import os
import select
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.config.opaque import API_VERSION
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.faults import PREPARE_POINTS, SHARING_POINTS, UNPREPARE_POINTS
from driver.gpu.prepare import GpuHandler
from driver.gpu.sharing.claims import GpuSharing
from driver.gpu.sharing.handoff import MpsHandoff
from driver.gpu.sharing.mps import MpsDaemons, start_time
from driver.nvml.backend import ComputeMode
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.vf.config import VfConfig
from fabric.simhost.host import SimHost
from fabric.simhost.nvidia_smi import read_record
from fabric.simhost.topologies import TOPOLOGIES
from tests.claims_doubles import NODE, Reader
from tests.sharing_claims import MPS, daemons_of, gpu_config


class Crash(BaseException):
    """The process dies here (SIGKILL in production)."""


class Node:
    """A simulated host's disk and tools, the fake NVML; ``start`` is a plugin."""

    def __init__(self, tmp: Path) -> None:
        self.host = SimHost.build(TOPOLOGIES["2-gpus"](), tmp / "h")
        by_bdf = sorted(self.host.gpu_uuids().items())
        self.uuids = [u for _, u in by_bdf]
        self.machine = FakeMachine()
        for bdf, uuid in by_bdf:
            self.machine.add_gpu(uuid, "H100-SXM5-80GB", bdf)
        self.inventory = NodeInventory()
        self.inventory.replace_pool(NODE, [
            Device(name=f"gpu-{i}", kind="gpu", local_id=u, attributes={"minor": i})
            for i, u in enumerate(self.uuids)
        ])  # fmt: skip
        self.reader = Reader()
        self.cdi = CdiRegistry(tmp / "cdi")
        self.tmp = tmp
        self.mps = MpsHandoff(
            MpsDaemons(self.host.mps_control, self.host.mps_root), supervised=False
        )

    async def start(self, nvidia_smi: Path | None = None) -> ClaimPreparer:
        smi = nvidia_smi or self.host.nvidia_smi
        sharing = GpuSharing(FakeNvml(self.machine), smi, self.mps)
        store = CheckpointStore(self.tmp / "cp.json", "boot")
        handlers = {"gpu": GpuHandler(self.tmp / "dev")}
        prep = ClaimPreparer(
            self.reader, self.inventory, handlers, store, self.cdi, sharing=sharing
        )
        await prep.recover()
        return prep

    def modes(self) -> list[int]:
        return [self.machine.gpus[u].compute_mode for u in self.uuids]

    def timeslices(self) -> dict[str, int]:
        slices = read_record(self.host.dir)["timeslice"]
        assert isinstance(slices, dict)
        return slices

    def daemon(self, ref: ClaimRef) -> int | None:
        return self.mps.running(self.mps.directory(ref.uid))

    def spec_edits(self, ref: ClaimRef) -> dict[str, Any]:
        edits: dict[str, Any] = json.loads(self.cdi.spec_path(ref.uid).read_text())[
            "containerEdits"
        ]
        return edits


def wait_gone(pid: int, within: float = 10.0) -> None:
    """Until the process has exited (a zombie nobody reaps included): its pidfd
    turns readable then, so no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], within)
        assert ready, f"process {pid} still running after {within:.0f}s"
    finally:
        os.close(fd)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    for d in n.host.mps_root.glob("*"):  # never leave a daemon behind a failed test
        n.mps.stop(d)
    shutil.rmtree(n.host.mps_root, ignore_errors=True)


async def test_mps_claim_shared_by_two_pods_one_daemon_through_a_restart(node: Node) -> None:
    ref = node.reader.add("c", ["gpu-0", "gpu-1"], config=[gpu_config(MPS)])
    first = await node.start()
    assert (await first.prepare([ref]))[ref.uid].error == ""
    pid = node.daemon(ref)
    assert pid is not None and node.modes() == [ComputeMode.EXCLUSIVE_PROCESS] * 2
    pipe, logs = node.mps.dirs(node.mps.directory(ref.uid))
    edits = node.spec_edits(ref)
    assert {"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M,1=2048M"} <= set(edits["env"])  # fmt: skip
    mounts = {m["hostPath"]: (m["containerPath"], m["options"][0]) for m in edits["mounts"]}
    assert mounts[str(pipe)] == ("/tmp/nvidia-mps", "rw")
    assert mounts[str(logs)] == ("/var/log/nvidia-mps", "ro")
    told = json.loads((logs / "standin-state.json").read_text())
    assert told["visible_devices"] == ",".join(node.uuids)
    assert told["active_thread_percentage"] == 40
    assert told["pinned_mem_limits"] == dict.fromkeys(node.uuids, "2048M")
    # The second pod's prepare of the same claim: the same daemon, no second start.
    assert (await first.prepare([ref]))[ref.uid].error == ""
    # A plugin restart (new process state, same disk) adopts the daemon.
    again = await node.start()
    assert node.daemon(ref) == pid
    assert (logs / "control.log").read_text().count("Startup") == 1
    # The kubelet unprepares once, after the last pod: daemon, dirs and mode go.
    assert (await again.unprepare([ref]))[ref.uid] == ""
    assert start_time(pid) is None and not node.mps.directory(ref.uid).exists()
    assert node.modes() == [ComputeMode.DEFAULT] * 2


async def test_a_daemon_lost_while_the_plugin_was_down_is_started_again(node: Node) -> None:
    ref = node.reader.add("c", ["gpu-0"], config=[gpu_config({"strategy": "MPS"})])
    first = await node.start()
    assert (await first.prepare([ref]))[ref.uid].error == ""
    pid = node.daemon(ref)
    assert pid is not None
    os.kill(pid, 9)
    wait_gone(pid)
    await node.start()
    assert node.daemon(ref) not in (None, pid)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in str(node.spec_edits(ref)["env"])


async def test_timeslicing_set_at_prepare_reset_at_unprepare(node: Node) -> None:
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    ref = node.reader.add("c", ["gpu-1"], config=[gpu_config(sharing)])
    other = node.reader.add("d", ["gpu-0"])
    prep = await node.start()
    assert (await prep.prepare([ref, other]))[ref.uid].error == ""
    assert node.timeslices() == {node.uuids[1]: 3}
    assert node.modes() == [ComputeMode.DEFAULT] * 2 and node.daemon(ref) is None
    assert not any("CUDA_MPS" in e for e in node.spec_edits(ref)["env"])
    assert (await prep.unprepare([ref]))[ref.uid] == ""
    assert node.timeslices() == {node.uuids[1]: 0}
    calls = read_record(node.host.dir)["calls"]
    assert calls == [["compute-policy", "-i", node.uuids[1], "--set-timeslice", s] for s in "30"]


async def test_the_limit_index_is_the_gpus_place_in_the_claim(node: Node) -> None:
    """Only the second request shares by MPS: its GPU is index 1 of the claim."""
    ref = node.reader.add("c", ["gpu-0", "gpu-1"], config=[gpu_config(MPS, ["req-1"])])
    prep = await node.start()
    assert (await prep.prepare([ref]))[ref.uid].error == ""
    env = node.spec_edits(ref)["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=2048M" in env
    assert node.modes() == [ComputeMode.DEFAULT, ComputeMode.EXCLUSIVE_PROCESS]
    assert (await prep.unprepare([ref]))[ref.uid] == ""


async def test_a_claim_whose_sharing_cannot_be_restored_does_not_stop_start_up(
    node: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}
    ref = node.reader.add("c", ["gpu-0"], config=[gpu_config(sharing)])
    prep = await node.start()
    assert (await prep.prepare([ref]))[ref.uid].error == ""
    again = await node.start(nvidia_smi=tmp_path / "gone")  # e.g. a driver root not mounted
    assert f"claim {ref.uid}: its GPU sharing cannot be restored" in caplog.text
    assert (await again.prepare([ref]))[ref.uid].error == ""  # still served from the checkpoint


@pytest.mark.parametrize("point", PREPARE_POINTS + SHARING_POINTS + UNPREPARE_POINTS)
async def test_a_crash_at_any_step_of_an_mps_claim_converges(
    point: str, node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.reader.add("c", ["gpu-0", "gpu-1"], config=[gpu_config(MPS)])
    first = await node.start()

    def crash_point(name: str) -> None:
        if name == point:
            raise Crash(name)

    for module in ("driver.claims.preparer", "driver.gpu.sharing.claims"):
        monkeypatch.setattr(f"{module}.crash_point", crash_point)
    with pytest.raises(Crash):
        assert (await first.prepare([ref]))[ref.uid].error == ""
        await first.unprepare([ref])
    monkeypatch.undo()
    again = await node.start()
    if point not in UNPREPARE_POINTS and point != "sharing-mps-stopped":
        assert (await again.prepare([ref]))[ref.uid].error == ""
        assert node.daemon(ref) is not None
    assert (await again.unprepare([ref]))[ref.uid] == ""
    assert list(node.host.mps_root.iterdir()) == []  # no daemon directory left
    assert node.modes() == [ComputeMode.DEFAULT] * 2 and node.cdi.claim_uids() == set()
    assert daemons_of(node.host.mps_root) == []


@pytest.mark.parametrize(
    ("sharing", "field"),
    [
        ({"strategy": "Spread"}, "field sharing.strategy"),
        ({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}},
         "field sharing.mpsConfig.defaultActiveThreadPercentage"),
        ({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}},
         "field sharing.mpsConfig.defaultActiveThreadPercentage"),
        ({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
         "field sharing.timeSlicingConfig.interval"),
        ({"strategy": "Exclusive", "mpsConfig": {}}, "mpsConfig is for strategy MPS"),
    ],
)  # fmt: skip
async def test_bad_sharing_fails_its_claim_naming_the_field(
    sharing: dict[str, Any], field: str, node: Node
) -> None:
    bad = node.reader.add("bad", ["gpu-0"], config=[gpu_config(sharing)])
    good = node.reader.add("good", ["gpu-1"], config=[gpu_config(MPS)])
    prep = await node.start()
    results = await prep.prepare([bad, good])
    assert field in results[bad.uid].error and results[good.uid].error == ""
    assert node.modes() == [ComputeMode.DEFAULT, ComputeMode.EXCLUSIVE_PROCESS]
    assert node.cdi.claim_uids() == {good.uid}
    assert (await prep.unprepare([good]))[good.uid] == ""


def test_a_sharing_block_on_a_vf_config_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="sharing"):
        VfConfig.model_validate({"apiVersion": API_VERSION, "kind": "VfConfig", "sharing": {}})
