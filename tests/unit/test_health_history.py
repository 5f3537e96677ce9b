"""The GPUs' health history: bounded in the health file, copied onto the Node's
``patchbay.dev/health`` annotation within its cap, written only on change."""

from __future__ import annotations

import json
import time
from pathlib import Path

from driver.devices.model import Device
from driver.health.history import CAP_BYTES, HEALTH_ANNOTATION, NOTE_CHARS, NodeHealth, node_health
from driver.health.monitor import HealthMonitor
from driver.health.policy import HealthSettings
from driver.health.records import HEALTHY, HISTORY, PAST_GPUS, HealthRecords, Phase
from driver.kube.memory import MemoryKube
from driver.kube.node_annotation import NodeAnnotation

U0, U1 = "GPU-aaaa", "GPU-bbbb"
NODE = "/api/v1/nodes/node-a"


def monitor_in(directory: Path) -> HealthMonitor:
    monitor = HealthMonitor(HealthSettings(), HealthRecords.in_dir(directory), boot_id="b")
    monitor.set_devices({"node-a": [Device("gpu-0", "gpu", U0), Device("gpu-1", "gpu", U1)]})
    return monitor


def annotation(monitor: HealthMonitor) -> NodeHealth | None:
    text = node_health(monitor.records, 3, 86400).to_annotation()
    if text is None:
        return None
    return NodeHealth.from_node({"metadata": {"annotations": {HEALTH_ANNOTATION: text}}})


def step_to(monitor: HealthMonitor, uuid: str, phase: str, step: str, note: str = "") -> None:
    record = monitor.record(uuid)
    assert record is not None
    record.phase = phase
    record.add(step, note)
    monitor.update(uuid, record)


def test_a_recovery_is_kept_after_the_gpu_is_healthy_and_across_a_restart(
    tmp_path: Path,
) -> None:
    monitor = monitor_in(tmp_path)
    assert annotation(monitor) is None  # no GPU ever failed: no annotation at all
    monitor.report_xid(U0, 48)
    step_to(monitor, U0, Phase.RESETTING, "resetting")
    monitor.records.note_reset(U0, time.time(), 86400)
    step_to(monitor, U0, Phase.CHECKING, "reset")
    monitor.mark_healthy(U0, "check passed 3 s after the failure")
    assert monitor.record(U0) is None
    again = annotation(monitor_in(tmp_path))  # a new process: from gpu-health.json
    assert again is not None and set(again.gpus) == {U0}
    gpu = again.gpus[U0]
    assert gpu.state == HEALTHY and gpu.failure_class == "" and len(gpu.resets) == 1
    assert [(s[1], s[2]) for s in gpu.steps] == [
        ("tainted", "unhealthy"), ("resetting", "resetting"), ("checking", "reset"),
        ("healthy", "healthy"),
    ]  # fmt: skip
    assert gpu.steps[-1][3] == "check passed 3 s after the failure"
    assert (again.reset_limit, again.reset_window) == (3, 86400)


def test_history_is_bounded_per_gpu_across_recoveries_and_in_gpus(tmp_path: Path) -> None:
    monitor = monitor_in(tmp_path)
    for _ in range(3):  # three failures, each with many steps
        monitor.report_xid(U0, 48)
        for i in range(HISTORY):
            step_to(monitor, U0, Phase.TAINTED, "reset-refused", f"try {i}")
        monitor.mark_healthy(U0, "passed")
    assert len(monitor.records.history(U0)) == HISTORY
    assert monitor.records.history(U0)[-1].step == HEALTHY
    monitor.report_xid(U0, 48)  # failed again: the past and the new record, together bounded
    history = monitor.records.history(U0)
    assert len(history) == HISTORY and history[-1].step == "unhealthy"
    assert history[-2].step == HEALTHY
    records = monitor.records
    for i in range(PAST_GPUS + 5):  # many GPUs come and go (fabric GPUs, say)
        uuid = f"GPU-{i:04d}"
        monitor.report_xid(uuid, 48)
        monitor.mark_healthy(uuid, "passed")
    assert len(records.data.past) == PAST_GPUS
    assert "GPU-0000" not in records.data.past and f"GPU-{PAST_GPUS + 4:04d}" in records.data.past


def test_the_annotation_says_state_class_reason_and_cuts_notes(tmp_path: Path) -> None:
    monitor = monitor_in(tmp_path)
    monitor.report_xid(U0, 48)
    monitor.report_xid(U1, 79)  # replace class
    record = monitor.record(U0)
    assert record is not None
    record.phase, record.reason = Phase.FAILED, "reset-failed"
    record.add("reset-failed", "the reset failed: " + "x" * 500)
    monitor.update(U0, record)
    view = annotation(monitor)
    assert view is not None
    a, b = view.gpus[U0], view.gpus[U1]
    assert (a.state, a.failure_class, a.xid, a.reason) == ("failed", "reset", 48, "reset-failed")
    assert (b.state, b.failure_class, b.xid) == ("tainted", "replace", 79)
    assert a.since.endswith("Z") and len(a.steps[-1][3]) == NOTE_CHARS


def test_the_annotation_stays_under_its_cap_dropping_the_oldest_steps(tmp_path: Path) -> None:
    monitor = monitor_in(tmp_path)
    records = monitor.records
    for i in range(PAST_GPUS):
        uuid = f"GPU-{i:04d}"
        monitor.report_xid(uuid, 48)
        for j in range(HISTORY):
            step_to(monitor, uuid, Phase.TAINTED, "reset-refused", "n" * 200)
            (records.data.gpus[uuid].history[-1]).at = 1e9 + 100 * i + j  # GPU i's are newer
    full = node_health(records, 3, 86400)
    assert len(json.dumps({u: g.as_json() for u, g in full.gpus.items()})) > CAP_BYTES
    text = full.to_annotation()
    assert text is not None and len(text.encode()) <= CAP_BYTES
    kept = NodeHealth.from_node({"metadata": {"annotations": {HEALTH_ANNOTATION: text}}})
    assert kept is not None
    newest = kept.gpus[f"GPU-{PAST_GPUS - 1:04d}"]
    assert len(newest.steps) == HISTORY  # the newest GPU kept all its steps
    assert kept.gpus["GPU-0000"].steps == ()  # an unhealthy GPU stays, with its state
    assert kept.gpus["GPU-0000"].state == Phase.TAINTED


def test_from_node_reads_nothing_from_a_missing_or_malformed_annotation() -> None:
    assert NodeHealth.from_node({"metadata": {}}) is None
    bad = {"metadata": {"annotations": {HEALTH_ANNOTATION: "{"}}}
    assert NodeHealth.from_node(bad) is None


async def test_the_node_annotation_is_written_only_when_it_changes() -> None:
    api = MemoryKube()
    api.add("/api/v1/nodes", {"metadata": {"name": "node-a", "annotations": {"other": "x"}}})
    note = NodeAnnotation(api, "node-a", HEALTH_ANNOTATION, "GPU health history")

    async def patches() -> int:
        await note.sync()
        return sum(1 for r in api.requests if r[0] == "PATCH")

    note.seed(await api.get(NODE))
    assert await patches() == 0  # nothing wanted yet: nothing written (or removed)
    note.set(None)
    assert await patches() == 0  # absent and wanted absent
    note.set('{"v":1}')
    note.set('{"v":1}')
    assert await patches() == 1
    assert await patches() == 1  # written: nothing pending
    annotations = (await api.get(NODE))["metadata"]["annotations"]
    assert annotations == {"other": "x", HEALTH_ANNOTATION: '{"v":1}'}
    again = NodeAnnotation(api, "node-a", HEALTH_ANNOTATION, "GPU health history")
    again.seed(await api.get(NODE))  # a restarted plugin that wants the same
    again.set('{"v":1}')
    assert not again.pending
    note.set(None)  # the history is gone: the annotation goes
    assert await patches() == 2
    assert HEALTH_ANNOTATION not in (await api.get(NODE))["metadata"]["annotations"]
