"""GPU recovery on the node: reset, check, healthy again; and every way it
stops short (class, claims, failed reset, failure after it, limit, crash).

NVML is the in-memory fake; the reset is what nvidia-smi does to it
(``FakeMachine.reset_gpu``, refused while a process holds the GPU). The
real path (pynvml over the C mock, the simulated host's nvidia-smi, the XID
watcher letting go) is tests/contract/test_gpu_reset.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from driver.devices.model import Device
from driver.health.history import node_health
from driver.health.monitor import HealthMonitor
from driver.health.policy import HealthSettings
from driver.health.records import HEALTH_FILE, HealthRecords, Phase
from driver.health.recovery import GpuRecovery
from driver.health.reset import NodeGpuOps, ResetOutcome, ResetResult
from driver.metrics import GPU_FAILURES, GPU_RESETS
from driver.nvml.condition import RecoveryAction
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine

U0, U1 = "GPU-aaaa", "GPU-bbbb"
GPU0 = Device("gpu-0", "gpu", U0)
GPU1 = Device("gpu-1", "gpu", U1)


class MachineOps(NodeGpuOps):
    """NVML reads through the fake; the reset as nvidia-smi does it."""

    def __init__(self, machine: FakeMachine) -> None:
        super().__init__(FakeNvml(machine), Path("/nonexistent/nvidia-smi"))
        self.machine = machine
        self.resets: list[str] = []
        self.fail = False
        self.after_reset: list[int] = []  # XIDs the GPU raises right after its reset
        self.monitor: HealthMonitor | None = None

    def reset(self, uuid: str, bus_id: str) -> ResetResult:
        self.resets.append(uuid)
        if self.machine.gpus[uuid].processes:
            return ResetResult(ResetOutcome.IN_USE, "in use by another process")
        if self.fail:
            return ResetResult(ResetOutcome.FAILED, "exit 254: Unknown Error")
        self.machine.reset_gpu(uuid)
        for xid in self.after_reset:  # from this thread, as the XID watcher's would come
            assert self.monitor is not None
            self.machine.set_condition(uuid, recovery_action=RecoveryAction.GPU_RESET)
            self.monitor.report_xid(uuid, xid)
        return ResetResult(ResetOutcome.DONE, "reset")


class Monitor(HealthMonitor):
    """Records the Events it would write on the Node, in order."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.told: list[str] = []
        self.notes: list[str] = []

    def warn(self, reason: str, note: str) -> None:
        self.told.append(reason)
        self.notes.append(note)

    def tell(self, reason: str, note: str) -> None:
        self.told.append(reason)
        self.notes.append(note)


class Node:
    def __init__(self, tmp: Path, **settings: object) -> None:
        self.tmp = tmp
        self.machine = FakeMachine()
        self.machine.add_gpu(U0, "H100-SXM5-80GB", "0000:3b:00.0")
        self.machine.add_gpu(U1, "H100-SXM5-80GB", "0000:86:00.0")
        self.settings = HealthSettings.model_validate({"gpu_health_settle": 0, **settings})
        self.claimed: set[str] = set()
        self.start()

    def start(self) -> None:
        """A (new) plugin process over the same node and plugin directory."""
        self.ops = MachineOps(self.machine)
        self.monitor = Monitor(
            self.settings, HealthRecords.in_dir(self.tmp), self.ops.condition, "boot"
        )
        self.ops.monitor = self.monitor
        self.monitor.set_devices({"node-a": [GPU0, GPU1]})
        self.recovery = GpuRecovery(
            self.monitor, self.settings, self.ops, self.claimed.__contains__
        )
        self.monitor.on_record = self.recovery.wake

    def fail(self, uuid: str, xid: int, **condition: object) -> None:
        self.machine.set_condition(uuid, **condition)  # type: ignore[arg-type]
        self.monitor.report_xid(uuid, xid)

    def taint(self, device: Device) -> tuple[str, str] | None:
        (d,) = self.monitor.tainted([device])
        return (d.taints[0].value, d.taints[0].effect) if d.taints else None


def resets(result: str) -> float:
    return float(GPU_RESETS.labels(result=result)._value.get())


async def test_a_reset_class_failure_is_reset_checked_and_published_healthy(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.claimed.add(U0)  # a pod uses it
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET, ecc_uncorrected=1)
    assert node.taint(GPU0) == ("xid-48", "NoExecute")
    tried, ok = resets("tried"), resets("succeeded")
    await node.recovery.pass_once()
    await node.recovery.pass_once()  # the same wait is told once
    assert node.ops.resets == []  # never while a prepared claim uses it
    node.claimed.clear()  # evicted: its claim unprepared
    await node.recovery.pass_once()
    assert node.ops.resets == [U0]
    assert node.taint(GPU0) is None and node.monitor.record(U0) is None
    assert node.monitor.told == [
        "DeviceUnhealthy", "GpuResetWaiting", "GpuResetStarted", "GpuReset", "GpuHealthy"
    ]  # fmt: skip
    assert (resets("tried") - tried, resets("succeeded") - ok) == (1, 1)
    assert json.loads((tmp_path / HEALTH_FILE).read_text())["gpus"] == {}
    node.start()  # a restart: the story is still there for the Node's annotation
    story = node_health(node.monitor.records, 3, 86400).gpus[U0]
    assert [s[1] for s in story.steps] == ["tainted", "resetting", "checking", "healthy"]
    assert (story.state, len(story.resets)) == ("healthy", 1)


@pytest.mark.parametrize(("xid", "cls"), [(79, "replace"), (154, "reboot")])
async def test_reboot_and_replace_classes_are_never_reset(
    tmp_path: Path, xid: int, cls: str
) -> None:
    node = Node(tmp_path)
    before = GPU_FAILURES.labels(cls)._value.get()
    node.fail(U0, xid, recovery_action=None)
    assert GPU_FAILURES.labels(cls)._value.get() - before == 1  # replacements counted
    await node.recovery.pass_once()
    assert node.ops.resets == []
    assert node.monitor.record(U0).failure_class == cls  # type: ignore[union-attr]
    assert node.taint(GPU0) is not None


async def test_resets_off_by_policy_leave_it_tainted(tmp_path: Path) -> None:
    node = Node(tmp_path, gpu_reset=False, reset_class_taint="NoSchedule")
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert node.ops.resets == [] and node.taint(GPU0) == ("xid-48", "NoSchedule")


async def test_a_failed_reset_stays_tainted_with_its_reason_and_is_not_retried(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    node.ops.fail = True
    failed = resets("failed")
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    await node.recovery.pass_once()
    assert node.ops.resets == [U0]  # no loop
    assert node.taint(GPU0) == ("xid-48-reset-failed", "NoExecute")
    assert node.monitor.told[-1] == "GpuRecoveryFailed"
    assert resets("failed") - failed == 1


async def test_a_gpu_failing_again_after_its_reset_stays_tainted(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.ops.after_reset = [48]
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    await node.recovery.pass_once()
    assert node.ops.resets == [U0]
    assert node.taint(GPU0) == ("xid-48-failed-after-reset", "NoExecute")
    assert "GpuHealthy" not in node.monitor.told


async def test_a_new_xid_in_the_settle_window_fails_the_check(tmp_path: Path) -> None:
    node = Node(tmp_path, gpu_health_settle=3600)  # ends early only by the new XID
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    reset_told = asyncio.Event()
    tell = node.monitor.tell

    def told(reason: str, note: str) -> None:
        tell(reason, note)
        if reason == "GpuReset":
            reset_told.set()

    node.monitor.tell = told  # type: ignore[method-assign]
    step = asyncio.create_task(node.recovery.pass_once())
    await asyncio.wait_for(reset_told.wait(), 60)  # order, not time (60 s: a safety net)
    node.fail(U0, 95, recovery_action=RecoveryAction.GPU_RESET)
    await asyncio.wait_for(step, 30)  # a safety net; the window ends at the XID
    assert node.taint(GPU0) == ("xid-95-failed-after-reset", "NoExecute")
    assert node.monitor.told[-1] == "GpuFailedAfterReset"


async def test_at_most_n_resets_per_window(tmp_path: Path) -> None:
    node = Node(tmp_path, gpu_reset_limit=1)
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert node.taint(GPU0) is None  # the first reset cured it
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert node.ops.resets == [U0]
    assert node.taint(GPU0) == ("xid-48-reset-limit", "NoExecute")


async def test_a_health_check_that_fails_keeps_the_taint(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    reset = node.machine.reset_gpu

    def reset_that_does_not_cure(uuid: str) -> None:
        reset(uuid)
        node.machine.set_condition(uuid, ecc_uncorrected=2)

    node.machine.reset_gpu = reset_that_does_not_cure  # type: ignore[method-assign]
    await node.recovery.pass_once()
    assert node.taint(GPU0) == ("xid-48-check-failed", "NoExecute")


async def test_a_process_holding_the_gpu_delays_the_reset(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.machine.set_processes(U0, [4242])  # a monitoring agent, say
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert node.ops.resets == [] and node.monitor.record(U0).phase == Phase.TAINTED  # type: ignore[union-attr]
    node.machine.set_processes(U0, [])
    await node.recovery.pass_once()
    assert node.taint(GPU0) is None


async def test_mig_mode_is_restored_after_the_reset(tmp_path: Path) -> None:
    node = Node(tmp_path)
    nvml = FakeNvml(node.machine)
    nvml.init()
    nvml.set_mig_mode(U0, True)  # Hopper: at once
    node.machine.gpus[U0].mig_pending = False  # a reset would come back without MIG
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert node.machine.gpus[U0].mig_current is True
    assert node.taint(GPU0) is None


async def test_a_crash_after_the_reset_was_saved_finishes_it(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    record = node.monitor.record(U0)
    assert record is not None
    record.phase = Phase.RESETTING  # what the crashed process saved before nvidia-smi
    node.monitor.update(U0, record)
    node.start()  # the restarted plugin
    assert node.taint(GPU0) == ("xid-48", "NoExecute")  # not healthy before the check
    await node.recovery.pass_once()
    assert node.ops.resets == [U0] and node.taint(GPU0) is None


async def test_a_crash_then_a_claim_undoes_the_reset(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    record = node.monitor.record(U0)
    assert record is not None
    record.phase = Phase.RESETTING
    node.monitor.update(U0, record)
    node.claimed.add(U0)  # a claim prepared on it (NoSchedule policy, say)
    node.start()
    await node.recovery.pass_once()
    assert node.ops.resets == []
    assert node.monitor.record(U0).phase == Phase.TAINTED  # type: ignore[union-attr]


async def test_a_crash_while_checking_checks_again_without_a_reset(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    node.machine.reset_gpu(U0)  # the reset happened; the process died before the check
    record = node.monitor.record(U0)
    assert record is not None
    record.phase = Phase.CHECKING
    node.monitor.update(U0, record)
    node.start()
    assert node.taint(GPU0) is not None
    await node.recovery.pass_once()
    assert node.ops.resets == [] and node.taint(GPU0) is None


async def test_a_reset_nvidia_smi_refuses_for_a_holder_is_retried(tmp_path: Path) -> None:
    """A monitoring agent holds the GPU open: NVML lists no process, nvidia-smi
    refuses. Not a failed reset (nor one the limit counts): the GPU waits,
    tainted, and is reset later."""
    node = Node(tmp_path, gpu_reset_limit=1)
    agent = [4242]
    node.ops.processes = lambda uuid: []  # type: ignore[method-assign]
    reset = node.ops.reset

    def held_reset(uuid: str, bus_id: str) -> ResetResult:
        if agent:
            node.ops.resets.append(uuid)
            return ResetResult(ResetOutcome.IN_USE, "in use by another process (PIDs [4242])")
        return reset(uuid, bus_id)

    node.ops.reset = held_reset  # type: ignore[method-assign]
    refused = resets("refused")
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert node.monitor.record(U0).phase == Phase.TAINTED  # type: ignore[union-attr]
    assert node.taint(GPU0) == ("xid-48", "NoExecute")  # no failure reason
    assert resets("refused") - refused == 1
    assert node.monitor.told[-1] == "GpuResetWaiting"
    agent.clear()
    await node.recovery.pass_once()
    assert node.ops.resets == [U0, U0] and node.taint(GPU0) is None


async def test_no_claim_is_prepared_while_the_gpu_resets(tmp_path: Path) -> None:
    """The reset runs under the claim preparer's lock: a prepare on the GPU
    (a claim tolerating its taint) waits until the reset is done."""
    node = Node(tmp_path)
    lock = asyncio.Lock()
    node.recovery.claim_lock = lock
    held_during_reset: list[bool] = []
    reset = node.ops.reset

    def observed_reset(uuid: str, bus_id: str) -> ResetResult:
        held_during_reset.append(lock.locked())
        return reset(uuid, bus_id)

    node.ops.reset = observed_reset  # type: ignore[method-assign]
    node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)
    await node.recovery.pass_once()
    assert held_during_reset == [True] and not lock.locked()
    assert node.taint(GPU0) is None


async def test_a_claim_change_wakes_the_recovery_only_while_a_gpu_has_a_record(
    tmp_path: Path,
) -> None:
    """Every prepare and unprepare tells the recovery; with no GPU unhealthy a
    pass would find nothing, so none starts (issue 36: a task, a gather and a
    wait_for per claim on the plugin's hot path). With a GPU waiting for its
    claims to go, the change wakes a pass."""
    node = Node(tmp_path, gpu_reset=False)
    passes: list[int] = []
    passed = asyncio.Event()
    pass_once = node.recovery.pass_once

    async def counted() -> None:
        await pass_once()
        passes.append(len(passes))
        passed.set()

    node.recovery.pass_once = counted  # type: ignore[method-assign]

    async def next_pass() -> None:
        await asyncio.wait_for(passed.wait(), 30)
        passed.clear()

    task = asyncio.create_task(node.recovery.run())
    try:
        await next_pass()  # the first look, at start
        for _ in range(3):
            node.recovery.claims_changed()
            for _ in range(20):  # turns of the loop: a woken run would pass here
                await asyncio.sleep(0)
        assert passes == [0]
        node.fail(U0, 48, recovery_action=RecoveryAction.GPU_RESET)  # wakes it itself
        await next_pass()
        node.recovery.claims_changed()
        await next_pass()
        assert passes == [0, 1, 2] and node.monitor.record(U0) is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
