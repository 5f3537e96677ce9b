"""The plugin's health wiring: which prepared claims keep a GPU from its reset."""

from __future__ import annotations

from driver.checkpoint import DeviceRecord
from driver.devices.model import Device
from driver.health.monitor import HealthMonitor
from plugin.gpu_health import in_use_by_claims, unhealthy_samples

GPU0 = Device("gpu-0", "gpu", "GPU-aaaa")
GPU1 = Device("gpu-1", "gpu", "GPU-bbbb")
MIG = Device("gpu-0-mig-1g-0", "mig", "gpu-0-mig-1g-0", {"profile": "1g.10gb"}, parent="GPU-aaaa")
SHARED = Device("gpu-0-shared", "shared-gpu", "GPU-aaaa", {"uuid": "GPU-aaaa"})


def record(device: Device) -> DeviceRecord:
    return DeviceRecord(
        request_names=["r"], pool_name="node-a", device_name=device.name,
        kind=device.kind, local_id=device.local_id,
    )  # fmt: skip


def test_a_gpu_is_in_use_through_itself_its_mig_devices_and_its_twin() -> None:
    monitor = HealthMonitor()
    monitor.set_devices({"node-a": [GPU0, GPU1, MIG, SHARED]})
    held: list[DeviceRecord] = []
    in_use = in_use_by_claims(lambda: held, monitor)
    assert not in_use("GPU-aaaa")
    for device in (GPU0, MIG, SHARED):
        held[:] = [record(device)]
        assert in_use("GPU-aaaa"), device.name
        assert not in_use("GPU-bbbb")


def test_unhealthy_gpus_are_counted_by_class_and_phase() -> None:
    monitor = HealthMonitor()
    gpus = [Device(f"gpu-{i}", "gpu", f"GPU-{i}") for i in range(3)]
    monitor.set_devices({"node-a": gpus})
    assert list(unhealthy_samples(monitor)) == []
    monitor.report_xid("GPU-0", 48)
    monitor.report_xid("GPU-1", 95)
    monitor.report_xid("GPU-2", 79)
    assert list(unhealthy_samples(monitor)) == [
        (("replace", "tainted"), 1.0), (("reset", "tainted"), 2.0)
    ]  # fmt: skip
