"""Device health from GPU XIDs: the monitor's lists and the NVML watcher thread."""

from __future__ import annotations

import asyncio

from driver.devices.model import Device
from driver.health.model import HealthStatus
from driver.health.monitor import HealthMonitor
from driver.health.xid import XidWatcher
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from tests.signals import Signal

GPU0 = Device("gpu-0", "gpu", "GPU-aaaa")
GPU1 = Device("gpu-1", "gpu", "GPU-bbbb")
MIG = Device("gpu-0-mig-1g", "mig", "MIG-1", {"profile": "1g.10gb"}, parent="GPU-aaaa")
VF = Device("vf-0000-17-00-2", "vf", "0000:17:00.2")


def states(monitor: HealthMonitor) -> dict[str, HealthStatus]:
    return {d.device_name: d.status for d in monitor.snapshot()}


async def test_critical_xid_marks_the_gpu_and_its_mig_devices_unhealthy() -> None:
    monitor = HealthMonitor()
    monitor.bind_loop()
    monitor.set_devices({"node-a": [GPU0, GPU1, MIG, VF]})
    assert set(states(monitor).values()) == {HealthStatus.HEALTHY}
    assert monitor.gpus() == ["GPU-aaaa", "GPU-bbbb"]
    stream = aiter(monitor.updates())
    assert len(await anext(stream)) == 4
    monitor.report_xid("GPU-aaaa", 13)  # an application error: still healthy
    monitor.report_xid("GPU-aaaa", 79)  # fell off the bus
    after = await asyncio.wait_for(anext(stream), 2)
    bad = {d.device_name: d.message for d in after if d.status is HealthStatus.UNHEALTHY}
    why = "GPU reported critical XID 79 (replace class, tainted)"
    assert bad == {"gpu-0": why, "gpu-0-mig-1g": why}
    (t_gpu, t_mig) = (d for d in monitor.tainted([GPU0, GPU1, MIG, VF]) if d.taints)
    assert [d.name for d in (t_gpu, t_mig)] == ["gpu-0", "gpu-0-mig-1g"]
    (taint,) = t_gpu.taints
    assert (taint.key, taint.value, taint.effect) == (
        "patchbay.dev/unhealthy",
        "xid-79",
        "NoExecute",  # the replace class's default
    )
    back = Device.from_json(t_gpu.to_json(), t_gpu.local_id)
    assert back == t_gpu  # the slice JSON keeps the taint, timeAdded included
    # Unplugged and plugged back: a re-plug is no repair, it stays unhealthy.
    monitor.set_devices({"node-a": [GPU1, VF]})
    monitor.set_devices({"node-a": [GPU0, GPU1, VF]})
    assert states(monitor)["gpu-0"] is HealthStatus.UNHEALTHY


async def test_watcher_delivers_nvml_xids_and_follows_the_gpu_set() -> None:
    machine = FakeMachine()
    machine.add_gpu("GPU-aaaa", "H100-SXM5-80GB", "0000:3b:00.0")
    machine.add_gpu("GPU-bbbb", "H100-SXM5-80GB", "0000:86:00.0")
    monitor = HealthMonitor()
    monitor.bind_loop()
    monitor.set_devices({"node-a": [GPU0, GPU1]})
    seen: list[tuple[str, int]] = []  # every XID the watcher delivered, in order
    delivered = Signal()

    def on_xid(uuid: str, xid: int) -> None:  # on the watcher's thread
        seen.append((uuid, xid))
        monitor.report_xid(uuid, xid)  # queued on the loop before the signal
        delivered.changed()

    watcher = XidWatcher(FakeNvml(machine), on_xid).start()
    try:
        watcher.set_gpus(["GPU-aaaa"])  # gpu-1 not watched yet
        machine.queue_xid("GPU-bbbb", 48)
        machine.queue_xid("GPU-aaaa", 31)  # application errors, delivered after
        await delivered.until("XID 31", lambda: len(seen) >= 1)
        machine.queue_xid("GPU-aaaa", 13)  # anything of gpu-1's would come before it
        await delivered.until("XID 13", lambda: ("GPU-aaaa", 13) in seen)
        assert seen == [("GPU-aaaa", 31), ("GPU-aaaa", 13)], "an unwatched GPU's XID came"
        assert set(states(monitor).values()) == {HealthStatus.HEALTHY}
        watcher.set_gpus(monitor.gpus())  # the set is rebuilt with both GPUs
        await delivered.until("XID 48", lambda: ("GPU-bbbb", 48) in seen)
        assert seen[2:] == [("GPU-bbbb", 48)]  # queued while unwatched, delivered once watched
        assert states(monitor) == {"gpu-0": HealthStatus.HEALTHY, "gpu-1": HealthStatus.UNHEALTHY}
    finally:
        await asyncio.to_thread(watcher.stop)


async def test_a_paused_watcher_holds_no_nvml_and_resumes() -> None:
    """A GPU reset needs no process on the GPU, the watcher's event set included."""
    machine = FakeMachine()
    machine.add_gpu("GPU-aaaa", "H100-SXM5-80GB", "0000:3b:00.0")
    nvml = FakeNvml(machine)
    seen: list[int] = []
    delivered = Signal()

    def on_xid(uuid: str, xid: int) -> None:
        seen.append(xid)
        delivered.changed()

    watcher = XidWatcher(nvml, on_xid).start()
    try:
        watcher.set_gpus(["GPU-aaaa"])
        machine.queue_xid("GPU-aaaa", 31)
        await delivered.until("watching", lambda: seen == [31])
        assert nvml._init_count == 1  # the watcher's NVML, held while it watches
        with watcher.paused():
            assert nvml._init_count == 0  # let go: event set closed, NVML shut down
            machine.queue_xid("GPU-aaaa", 13)
        await delivered.until("watching again", lambda: seen == [31, 13])
    finally:
        await asyncio.to_thread(watcher.stop)


async def test_a_gpu_handed_to_vfio_is_lost_to_nvml_on_purpose() -> None:
    """A passthrough claim binds the GPU to vfio-pci and NVML stops listing it,
    which the XID watcher reports as XID 79: no failure while it is handed
    over; once it is back, a fall off the bus is one again (the real-node
    tier's GPUs stayed tainted, replace class, after a VM's claim)."""
    monitor = HealthMonitor()
    monitor.bind_loop()
    monitor.set_devices({"node-a": [GPU0, GPU1]})
    monitor.handed_over("GPU-aaaa", True)
    monitor.report_xid("GPU-aaaa", 79)
    assert monitor.unhealthy() == {}
    monitor.handed_over("GPU-aaaa", False)
    monitor.report_xid("GPU-aaaa", 79)
    assert set(monitor.unhealthy()) == {"GPU-aaaa"}


async def test_a_fabric_gpu_leaving_nvml_unheld_is_a_detach_not_a_failure() -> None:
    """XID 79 is how the watcher reports a GPU gone from NVML; a fabric GPU no
    claim holds leaves because the controller detached it (issue 38)."""
    monitor = HealthMonitor()
    monitor.bind_loop()
    monitor.set_devices({"fabric": [GPU0, GPU1]})
    monitor.leaving = lambda uuid: uuid == "GPU-aaaa"
    stream = aiter(monitor.updates())
    await anext(stream)
    monitor.report_xid("GPU-aaaa", 79)  # detached: dropped
    monitor.report_xid("GPU-bbbb", 79)  # held by a claim: a failure
    await asyncio.wait_for(anext(stream), 2)
    assert monitor.record("GPU-aaaa") is None and monitor.record("GPU-bbbb") is not None
