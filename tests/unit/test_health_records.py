"""GPU health survives a plugin restart: the versioned, atomic health file."""

from __future__ import annotations

import json
from pathlib import Path

from driver.devices.model import Device
from driver.health.model import HealthStatus
from driver.health.monitor import HealthMonitor
from driver.health.policy import HealthSettings
from driver.health.records import HEALTH_FILE, HealthRecords, Phase

GPU0 = Device("gpu-0", "gpu", "GPU-aaaa")
GPU1 = Device("gpu-1", "gpu", "GPU-bbbb")
MIG = Device("gpu-0-mig-1g", "mig", "MIG-1", {"profile": "1g.10gb"}, parent="GPU-aaaa")


def started(directory: Path, boot: str = "boot-1", **settings: object) -> HealthMonitor:
    monitor = HealthMonitor(
        HealthSettings.model_validate(settings), HealthRecords.in_dir(directory), boot_id=boot
    )
    monitor.set_devices({"node-a": [GPU0, GPU1, MIG]})
    return monitor


def unhealthy(monitor: HealthMonitor) -> set[str]:
    return {h.device_name for h in monitor.snapshot() if h.status is HealthStatus.UNHEALTHY}


def test_a_restart_keeps_a_failed_gpu_unhealthy_and_tainted(tmp_path: Path) -> None:
    first = started(tmp_path)
    first.report_xid("GPU-aaaa", 48)
    assert unhealthy(first) == {"gpu-0", "gpu-0-mig-1g"}
    again = started(tmp_path)  # a new process: nothing in memory
    assert unhealthy(again) == {"gpu-0", "gpu-0-mig-1g"}
    (taint,) = again.tainted([GPU0])[0].taints
    assert (taint.value, taint.effect) == ("xid-48", "NoExecute")
    assert again.record("GPU-aaaa") is not None
    assert again.record("GPU-aaaa").phase == Phase.TAINTED  # type: ignore[union-attr]


def test_the_taint_effect_is_the_class_policy(tmp_path: Path) -> None:
    monitor = started(tmp_path, reset_class_taint="NoSchedule", replace_class_taint="NoSchedule")
    monitor.report_xid("GPU-aaaa", 48)
    monitor.report_xid("GPU-bbbb", 154)  # reboot class
    effects = {d.name: d.taints[0].effect for d in monitor.tainted([GPU0, GPU1])}
    assert effects == {"gpu-0": "NoSchedule", "gpu-1": "NoSchedule"}
    monitor.report_xid("GPU-aaaa", 79)  # worse: now replace class
    assert monitor.record("GPU-aaaa").failure_class == "replace"  # type: ignore[union-attr]
    strict = started(tmp_path)  # the defaults: replace NoExecute, reboot NoSchedule
    effects = {d.name: d.taints[0].effect for d in strict.tainted([GPU0, GPU1])}
    assert effects == {"gpu-0": "NoExecute", "gpu-1": "NoSchedule"}


def test_a_newer_file_is_read_and_its_unknown_fields_kept(tmp_path: Path) -> None:
    newer = {
        "version": 2,
        "futureTopLevel": {"x": 1},
        "gpus": {"GPU-aaaa": {"class": "quarantine", "xid": 48, "since": 1.0,
                              "phase": "scrubbing", "futureField": [1, 2]}},
    }  # fmt: skip
    (tmp_path / HEALTH_FILE).write_text(json.dumps(newer))
    monitor = started(tmp_path)
    assert unhealthy(monitor) == {"gpu-0", "gpu-0-mig-1g"}  # unknown class and phase: tainted
    assert monitor.tainted([GPU0])[0].taints[0].effect == "NoExecute"  # read as replace
    monitor.report_xid("GPU-bbbb", 48)  # a write of this build
    saved = json.loads((tmp_path / HEALTH_FILE).read_text())
    assert saved["version"] == 2 and saved["futureTopLevel"] == {"x": 1}
    assert saved["gpus"]["GPU-aaaa"]["futureField"] == [1, 2]
    assert saved["gpus"]["GPU-aaaa"]["class"] == "quarantine"


def test_a_corrupt_file_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / HEALTH_FILE).write_text("{not json")
    monitor = started(tmp_path)
    assert unhealthy(monitor) == set()
    assert [p.name.startswith(f"{HEALTH_FILE}.corrupt-") for p in tmp_path.iterdir()] == [True]


def test_after_a_reboot_a_reset_class_gpu_is_checked_a_replace_one_stays(tmp_path: Path) -> None:
    before = started(tmp_path, boot="boot-1")
    before.report_xid("GPU-aaaa", 48)
    before.report_xid("GPU-bbbb", 79)
    after = started(tmp_path, boot="boot-2")
    assert after.record("GPU-aaaa").phase == Phase.CHECKING  # type: ignore[union-attr]
    assert after.record("GPU-bbbb").phase == Phase.TAINTED  # type: ignore[union-attr]
    assert unhealthy(after) == {"gpu-0", "gpu-0-mig-1g", "gpu-1"}  # still, until the check


def test_a_replugged_reset_class_gpu_goes_to_the_check(tmp_path: Path) -> None:
    monitor = started(tmp_path)
    monitor.report_xid("GPU-aaaa", 48)
    monitor.set_devices({"node-a": [GPU1]})
    monitor.set_devices({"node-a": [GPU0, GPU1, MIG]})
    assert monitor.record("GPU-aaaa").phase == Phase.CHECKING  # type: ignore[union-attr]
    assert "gpu-0" in unhealthy(monitor)
