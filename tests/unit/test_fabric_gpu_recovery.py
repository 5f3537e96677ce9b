"""A fabric GPU's failure on its node: never reset there, and its record
ends with its detach (issue 38, "Recovery, across the fabric").

The node is the simulated host's GPUDirect board (real sysfs tree, an
adapter on each root complex) with one H100 the fabric attached behind
adapter0; NVML is the in-memory fake over the same GPUs. The node's parts
are the plugin's own: the GPU scan, the fabric split, the health monitor
over ``gpu-health.json`` and the recovery. Two things are shown:

- the recovery resets a local reset-class GPU but never a fabric one (the
  controller detaches that and keeps its failure in its pool; a reset
  racing the detach would hot-remove a GPU under nvidia-smi), nor checks it
  after a reboot;
- the fabric GPU's record ends when it leaves the bus (not when NVML merely
  loses it), so the same GPU attached again starts healthy and is not
  reported failed to the controller again.
"""

from __future__ import annotations

from pathlib import Path

from driver.devices.model import Device
from driver.fabric_devices.node import FabricNodeView, gpu_failures, parse_adapters
from driver.gpu.kind import GpuType
from driver.health.history import node_health
from driver.health.monitor import HealthMonitor
from driver.health.policy import HealthSettings
from driver.health.records import DETACHED, HealthRecords, Phase
from driver.health.recovery import GpuRecovery
from driver.health.reset import NodeGpuOps, ResetOutcome, ResetResult
from driver.nvml.condition import RecoveryAction
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu

FABRIC_GPU = "GPU-5e0b1c2d-3f4a-4b5c-8d6e-7f8091a2b3c4"
ADAPTERS = "adapter0=0000:15:02.0,adapter1=0000:85:02.0"  # the gpu-nvme board's
SETTINGS = HealthSettings(gpu_health_settle=0)


class ResetSpy(NodeGpuOps):
    """NVML reads through the fake; a reset is recorded and done as nvidia-smi does it."""

    def __init__(self, machine: FakeMachine) -> None:
        super().__init__(FakeNvml(machine), Path("/nonexistent/nvidia-smi"))
        self.machine = machine
        self.resets: list[str] = []

    def reset(self, uuid: str, bus_id: str) -> ResetResult:
        self.resets.append(uuid)
        self.machine.reset_gpu(uuid)
        return ResetResult(ResetOutcome.DONE, "reset")


class Node:
    """The board, its NVML and the plugin's health parts over one plugin directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.host = SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp / "host", "node-c")
        (self.bdf,) = self.host.hot_add("adapter0", Gpu(self.host.free_bdf("adapter0"),
                                                        uuid=FABRIC_GPU))  # fmt: skip
        self.machine = FakeMachine()
        for g in self.host.nvml.read()["gpus"]:
            self.machine.add_gpu(g["uuid"], g["model"], g["pci_bus_id"], serial=g["serial"])
        self.gpus = GpuType(FakeNvml(self.machine), self.host.sysfs_root, tmp / "dev")
        self.view = FabricNodeView("node-c", parse_adapters(ADAPTERS), self.host.sysfs_root)
        self.start("boot-1")

    def start(self, boot: str) -> None:
        """A (new) plugin process: its monitor reads the records back, then a scan."""
        records = HealthRecords.in_dir(self.tmp / "plugin")
        self.ops = ResetSpy(self.machine)
        self.monitor = HealthMonitor(SETTINGS, records, self.ops.condition, boot)
        self.recovery = GpuRecovery(self.monitor, SETTINGS, self.ops, lambda uuid: False)
        self.rescan()

    def rescan(self) -> list[Device]:
        """The plugin's rescan: split, end the records of detached fabric GPUs,
        hand both pools to the monitor; the attached fabric devices."""
        local, attached = self.view.split(list(self.gpus.discover().devices))
        for uuid in self.view.detached(self.monitor.fabric_gpus(), attached):
            self.monitor.detached(uuid)
        self.monitor.set_devices({"node-c": local, "fabric": attached})
        self.local, self.attached = local, attached
        return attached

    def fail(self, uuid: str, xid: int) -> None:
        self.machine.set_condition(uuid, recovery_action=RecoveryAction.GPU_RESET)
        self.monitor.report_xid(uuid, xid)

    def taints(self, devices: list[Device]) -> list[tuple[str, str]]:
        return [(t.value, t.effect) for d in self.monitor.tainted(devices) for t in d.taints]


async def test_the_node_resets_a_local_gpu_but_never_a_fabric_one(tmp_path: Path) -> None:
    node = Node(tmp_path)
    (fabric,) = node.attached
    local = next(d for d in node.local if d.kind == "gpu")
    node.fail(FABRIC_GPU, 48)  # reset class, both
    node.fail(local.local_id, 48)
    assert node.taints([fabric]) == [("xid-48", "NoExecute")]  # its pods are evicted alike
    record = node.monitor.record(FABRIC_GPU)
    assert record is not None and (record.fabric, record.bus_id) == (True, node.bdf)
    await node.recovery.pass_once()
    await node.recovery.pass_once()
    assert node.ops.resets == [local.local_id]  # no prepared claim holds either
    assert node.monitor.record(local.local_id) is None and node.taints([local]) == []
    assert node.monitor.record(FABRIC_GPU).phase == Phase.TAINTED  # type: ignore[union-attr]
    # The controller reads it failed from the node's report, and detaches it.
    assert set(gpu_failures(node.monitor, node.attached)) == {FABRIC_GPU}
    # A reboot reset the local GPUs, not this one's failure: still not checked.
    node.start("boot-2")
    await node.recovery.pass_once()
    assert node.ops.resets == [] and node.taints([fabric]) == [("xid-48", "NoExecute")]
    assert node.monitor.record(FABRIC_GPU).phase == Phase.TAINTED  # type: ignore[union-attr]


async def test_a_fabric_gpus_record_ends_with_its_detach_not_before(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fail(FABRIC_GPU, 64)  # row remapping failed: replace class
    # NVML loses it (or is unavailable) while it is still on the bus: no detach.
    node.machine.remove_gpu(FABRIC_GPU)
    assert node.rescan() == []
    assert node.monitor.record(FABRIC_GPU) is not None
    # The controller detaches it: it leaves the bus, and its record ends here.
    node.host.hot_remove(node.bdf)
    node.rescan()
    assert node.monitor.record(FABRIC_GPU) is None
    story = node_health(node.monitor.records, 3, 86400).gpus[FABRIC_GPU]
    assert story.state == DETACHED and story.steps[-1][2] == DETACHED
    # A restarted plugin reads no record back.
    node.start("boot-1")
    assert node.monitor.fabric_gpus() == {}
    # Cleared by the operator, the same GPU is attached again: it starts healthy.
    node.host.hot_add("adapter0", Gpu(node.bdf, uuid=FABRIC_GPU))
    node.machine.add_gpu(FABRIC_GPU, "H100-SXM5-80GB", node.bdf)
    (again,) = node.rescan()
    assert again.local_id == FABRIC_GPU and node.taints([again]) == []
    assert gpu_failures(node.monitor, node.attached) == {}


async def test_a_fabric_gpu_replaced_at_its_address_ends_the_old_record(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fail(FABRIC_GPU, 64)
    node.machine.remove_gpu(FABRIC_GPU)
    node.rescan()  # NVML lost it: the record stays
    # The plugin missed the detach (it was down); another GPU sits at that address now.
    node.host.hot_remove(node.bdf)
    other = "GPU-0f0f0f0f-1111-4222-8333-444455556666"
    node.host.hot_add("adapter0", Gpu(node.bdf, uuid=other))
    node.machine.add_gpu(other, "H100-SXM5-80GB", node.bdf)
    (new,) = node.rescan()
    assert new.local_id == other and node.monitor.record(FABRIC_GPU) is None
    assert node.taints([new]) == []
