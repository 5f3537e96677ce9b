"""The plugin's health wiring: which prepared claims keep a GPU from its reset,
and the Node's health annotation that follows the health records."""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint import DeviceRecord
from driver.devices.model import Device
from driver.health.history import NodeHealth
from driver.health.monitor import HealthMonitor
from driver.health.records import HealthRecords
from driver.kube.memory import MemoryKube
from plugin.gpu_health import HealthHistory, in_use_by_claims, unhealthy_samples
from plugin.settings import PluginSettings

NODE = "/api/v1/nodes/node-a"

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


async def test_the_health_annotation_follows_the_records_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    settings = PluginSettings(node_name="node-a", plugin_dir=tmp_path)
    api = MemoryKube()
    api.add("/api/v1/nodes", {"metadata": {"name": "node-a"}})
    monitor = HealthMonitor(settings, HealthRecords.in_dir(tmp_path))
    history = HealthHistory(settings, api, monitor)
    history.start(await api.get(NODE))
    assert not history.annotation.pending  # nothing failed: nothing to write
    monitor.report_xid("GPU-aaaa", 48)  # a save: the annotation follows
    assert history.annotation.pending
    await history.annotation.sync()
    node = await api.get(NODE)
    told = NodeHealth.from_node(node)
    assert told is not None and told.gpus["GPU-aaaa"].state == "tainted"
    # A restarted plugin: the same file, the same text on the Node: no write.
    again = HealthMonitor(settings, HealthRecords.in_dir(tmp_path))
    restarted = HealthHistory(settings, api, again)
    restarted.start(node)
    assert not restarted.annotation.pending
    restarted.start({"metadata": {"name": "node-a"}})  # the Node lost it: written again
    assert restarted.annotation.pending
