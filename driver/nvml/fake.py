"""An in-memory NVML with the C mock's semantics, for fast unit tests.

:class:`FakeNvml` implements :class:`driver.nvml.backend.NvmlBackend` over a
:class:`driver.nvml.fake_state.FakeMachine`. Like real NVML it enumerates at
``init`` (GPUs added later appear after the next init), fails calls before
``init`` with UNINITIALIZED, reports a lost or removed GPU as GPU_IS_LOST,
rejects occupied placements with INSUFFICIENT_RESOURCES and invalid ones with
INVALID_ARGUMENT, keeps an Ampere MIG mode change pending until a reset, and
refuses to disable MIG while instances exist (IN_USE), and keeps a compute
mode per GPU with the mock's rules (``hack/nvml-mock/compute_mode.c``), and
answers utilization as the mock does (``hack/nvml-mock/utilization.c``: a
whole GPU's rate, GPM samples of MIG devices on Hopper and newer). Injected
failures are keyed by the NVML entry point the real backend would call at
that step.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass

from driver.errors import NvmlError
from driver.nvml.backend import (
    GPM_ARCHITECTURES,
    XID_FALLEN_OFF_BUS,
    ComputeMode,
    GpmSample,
    GpuInfo,
    MigInstance,
    MigProfile,
    NvmlReturn,
    ProcessUtilization,
    SystemInfo,
    XidEvent,
    counts_errors,
    nvml_error,
)
from driver.nvml.condition import GpuCondition
from driver.nvml.fake_state import FakeGpu, FakeInstance, FakeMachine

_GPU_QUERIES = (
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetName",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetPciInfo_v3",
)


@counts_errors
class FakeNvml:
    """One 'process' view of a FakeMachine."""

    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self._init_count = 0
        self._devices: list[str] = []

    def _fail(self, function: str, uuid: str | None = None, *, device: bool = False) -> None:
        error = self.machine.take_failure(function, uuid)
        if error is not None:
            raise nvml_error(error, f"injected failure in {function}", device=device)

    def _require_init(self) -> None:
        if self._init_count == 0:
            raise nvml_error(NvmlReturn.UNINITIALIZED)

    def init(self) -> None:
        self._fail("nvmlInitWithFlags")
        with self.machine.changed:
            self._devices = sorted(self.machine.gpus, key=lambda u: self.machine.gpus[u].pci_bus_id)
        self._init_count += 1

    def shutdown(self) -> None:
        self._require_init()
        self._init_count -= 1

    def system_info(self) -> SystemInfo:
        self._require_init()
        self._fail("nvmlSystemGetDriverVersion")
        return SystemInfo(self.machine.driver_version, self.machine.cuda_driver_version)

    def _gpu(self, uuid: str, function: str = "nvmlDeviceGetHandleByUUID") -> FakeGpu:
        self._require_init()
        self._fail(function, uuid)
        if uuid not in self._devices:
            raise nvml_error(NvmlReturn.NOT_FOUND, f"no GPU {uuid}")
        gpu = self.machine.gpus.get(uuid)
        if gpu is None or gpu.lost:
            raise nvml_error(NvmlReturn.GPU_IS_LOST, f"GPU {uuid} is lost")
        return gpu

    def gpus(self) -> list[GpuInfo]:
        self._require_init()
        self._fail("nvmlDeviceGetCount_v2")
        out = []
        for uuid in self._devices:
            try:
                out.append(self._info(uuid, "nvmlDeviceGetHandleByIndex_v2"))
            except NvmlError as exc:
                if exc.code != NvmlReturn.GPU_IS_LOST:
                    raise
        return out

    def gpu(self, uuid: str) -> GpuInfo | None:
        try:
            return self._info(uuid, "nvmlDeviceGetHandleByUUID")
        except NvmlError as exc:
            if exc.code in (NvmlReturn.NOT_FOUND, NvmlReturn.GPU_IS_LOST):
                return None
            raise

    def _info(self, uuid: str, lookup: str) -> GpuInfo:
        gpu = self._gpu(uuid, lookup)
        for function in _GPU_QUERIES:
            self._fail(function, uuid)
        m = gpu.model
        return GpuInfo(
            index=self._devices.index(uuid),
            minor=gpu.minor,
            uuid=gpu.uuid,
            serial=gpu.serial,
            product_name=m.product_name,
            brand=m.brand,
            architecture=m.architecture,
            cuda_compute_capability=m.cuda_compute_capability,
            memory_bytes=m.memory_mib << 20,
            pci_bus_id=gpu.pci_bus_id,
            mig_capable=m.mig_capable,
            mig_mode_current=gpu.mig_current and m.mig_capable,
            mig_mode_pending=gpu.mig_pending and m.mig_capable,
        )

    def set_mig_mode(self, uuid: str, enabled: bool) -> tuple[bool, bool]:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceSetMigMode", uuid, device=True)
        if not gpu.model.mig_capable:
            raise nvml_error(NvmlReturn.NOT_SUPPORTED, "no MIG on this GPU", device=True)
        if not enabled and gpu.instances:
            raise nvml_error(NvmlReturn.IN_USE, "MIG instances exist", device=True)
        gpu.mig_pending = enabled
        if not gpu.model.mig_needs_reset:
            gpu.mig_current = enabled
        self._fail("nvmlDeviceGetMigMode", uuid)
        return gpu.mig_current, gpu.mig_pending

    def mig_profiles(self, uuid: str) -> list[MigProfile]:
        gpu = self._gpu(uuid)
        if gpu.model.profiles:
            self._fail("nvmlDeviceGetGpuInstanceProfileInfoV", uuid)
        return list(gpu.model.profiles)

    def mig_instances(self, uuid: str) -> list[MigInstance]:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetMigMode", uuid)
        if not gpu.mig_current:
            return []
        out = []
        for gi in sorted(gpu.instances.values(), key=lambda g: (g.start, g.gi_id)):
            cis: list[tuple[int | None, str | None]] = sorted(gi.cis.items()) or [(None, None)]
            out += [MigInstance(gi.gi_id, gi.profile_id, gi.start, gi.size, c, u) for c, u in cis]
        return out

    def create_gpu_instance(self, uuid: str, profile_id: int, start: int) -> int:
        gpu = self._gpu(uuid)
        profile = next((p for p in self.mig_profiles(uuid) if p.profile_id == profile_id), None)
        if profile is None:
            raise nvml_error(NvmlReturn.INVALID_ARGUMENT, f"no profile {profile_id}", device=True)
        self._fail("nvmlDeviceCreateGpuInstanceWithPlacement", uuid, device=True)
        if not gpu.mig_current:
            raise nvml_error(NvmlReturn.NOT_SUPPORTED, "MIG mode is disabled", device=True)
        self._check_fit(gpu, profile, start)
        gi_id = next(i for i in range(1, 16) if i not in gpu.instances)
        gpu.instances[gi_id] = FakeInstance(gi_id, profile_id, start, profile.memory_slots)
        return gi_id

    def create_compute_instance(self, uuid: str, gi_id: int) -> MigInstance:
        gpu = self._gpu(uuid)
        gi = gpu.instances.get(gi_id) if gpu.mig_current else None
        if gi is None:
            raise nvml_error(NvmlReturn.NOT_FOUND, f"no GI {gi_id}", device=True)
        self._fail("nvmlGpuInstanceCreateComputeInstance", uuid, device=True)
        if gi.cis:
            raise nvml_error(NvmlReturn.INSUFFICIENT_RESOURCES, "GI is full", device=True)
        gi.cis[0] = f"MIG-{uuidlib.uuid4()}"
        return MigInstance(gi_id, gi.profile_id, gi.start, gi.size, 0, gi.cis[0])

    def _check_fit(self, gpu: FakeGpu, profile: MigProfile, start: int) -> None:
        if start not in {s for s, _ in profile.placements}:
            raise nvml_error(NvmlReturn.INVALID_ARGUMENT, f"bad placement {start}", device=True)
        by_id = {p.profile_id: p for p in gpu.model.profiles}
        slices = sum(by_id[g.profile_id].compute_slices for g in gpu.instances.values())
        same = sum(1 for g in gpu.instances.values() if g.profile_id == profile.profile_id)
        end = start + profile.memory_slots
        overlap = any(start < g.start + g.size and g.start < end for g in gpu.instances.values())
        if overlap or same >= profile.max_count or slices + profile.compute_slices > 7:
            raise nvml_error(
                NvmlReturn.INSUFFICIENT_RESOURCES, f"placement {start} is taken", device=True
            )

    def destroy_mig(self, uuid: str, gi_id: int) -> None:
        """Like the real backend: a missing GI, or MIG off, leaves nothing to do."""
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetGpuInstanceById", uuid, device=True)
        gi = gpu.instances.get(gi_id) if gpu.mig_current else None
        if gi is None:
            return
        for ci in sorted(gi.cis):
            self._fail("nvmlComputeInstanceDestroy", uuid, device=True)
            del gi.cis[ci]
        self._fail("nvmlGpuInstanceDestroy", uuid, device=True)
        del gpu.instances[gi_id]

    def compute_mode(self, uuid: str) -> int:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetComputeMode", uuid)
        return gpu.compute_mode

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceSetComputeMode", uuid, device=True)
        if mode not in {m.value for m in ComputeMode}:
            raise nvml_error(NvmlReturn.INVALID_ARGUMENT, f"compute mode {mode}", device=True)
        if mode == ComputeMode.EXCLUSIVE_THREAD or gpu.mig_current:
            raise nvml_error(NvmlReturn.NOT_SUPPORTED, f"compute mode {mode}", device=True)
        with self.machine.changed:
            gpu.compute_mode = mode

    def running_processes(self, uuid: str) -> list[int]:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetComputeRunningProcesses_v3", uuid)
        return sorted(gpu.processes)

    def process_utilization(self, uuid: str) -> list[ProcessUtilization]:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetProcessUtilization", uuid)
        if gpu.mig_current:
            raise nvml_error(NvmlReturn.NOT_SUPPORTED, "MIG is enabled: no process utilization")
        now = time.time_ns() // 1000
        return [ProcessUtilization(pid, min(sm, 100), min(mem, 100), now)
                for pid, (sm, mem) in sorted(gpu.process_util.items())]  # fmt: skip

    def condition(self, uuid: str) -> GpuCondition:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetFieldValues", uuid)
        return GpuCondition(
            gpu.recovery_action, gpu.row_remap_pending, gpu.row_remap_failure, gpu.ecc_uncorrected
        )

    def utilization(self, uuid: str) -> int:
        gpu = self._gpu(uuid)
        self._fail("nvmlDeviceGetUtilizationRates", uuid)
        if gpu.mig_current:
            raise nvml_error(NvmlReturn.NOT_SUPPORTED, "MIG is enabled: no GPU utilization")
        return min(gpu.util.level, 100)

    def mig_sample(self, uuid: str, gi_id: int) -> FakeGpmSample:
        gpu = self._gpu(uuid)
        self._fail("nvmlGpmQueryDeviceSupport", uuid)
        self._fail("nvmlGpmMigSampleGet", uuid)
        if gpu.model.architecture not in GPM_ARCHITECTURES or not gpu.mig_current:
            raise nvml_error(NvmlReturn.NOT_SUPPORTED, f"no GPM sample of a MIG device on {uuid}")
        gi = gpu.instances.get(gi_id)
        if gi is None:
            raise nvml_error(NvmlReturn.NOT_FOUND, f"no GI {gi_id}")
        now = self.machine.clock()
        return FakeGpmSample(uuid, gi_id, now, min(gi.util.level, 100), gi.util.at(now))

    def mig_utilization(self, first: GpmSample, second: GpmSample) -> float:
        a, b = first, second
        if not isinstance(a, FakeGpmSample) or not isinstance(b, FakeGpmSample):
            raise nvml_error(NvmlReturn.INVALID_ARGUMENT, "not GPM samples of this NVML")
        if (a.uuid, a.gi_id) != (b.uuid, b.gi_id):
            raise nvml_error(NvmlReturn.INVALID_ARGUMENT, "samples of two devices")
        self._require_init()
        self._fail("nvmlGpmMetricsGet", b.uuid)
        if a.t == b.t:  # the C mock's rule: the later level at no distance
            return float(a.level if a.t > b.t else b.level)
        return max(0.0, min(100.0, (b.busy - a.busy) / (b.t - a.t)))

    def watch_events(self, uuids: Sequence[str]) -> FakeEventWatcher:
        for uuid in uuids:
            self._gpu(uuid)
        return FakeEventWatcher(self.machine, list(uuids))


@dataclass(frozen=True)
class FakeGpmSample:
    """A GPM sample as the C mock keeps it: when, the level, the integral."""

    uuid: str
    gi_id: int
    t: int
    level: int
    busy: int

    def close(self) -> None:
        pass


@counts_errors
class FakeEventWatcher:
    """Delivers queued XIDs (once) and reports lost GPUs as XID 79, like the mock."""

    def __init__(self, machine: FakeMachine, uuids: list[str]) -> None:
        self._machine = machine
        self._uuids = uuids

    def _collect(self) -> list[XidEvent]:
        events = []
        lost = []
        for uuid in self._uuids:
            gpu = self._machine.gpus.get(uuid)
            if gpu is None or gpu.lost:
                lost.append(uuid)
                continue
            events += [XidEvent(uuid, xid) for xid in gpu.xids]
            gpu.xids.clear()
        self._uuids = [u for u in self._uuids if u not in lost]
        return events + [XidEvent(u, XID_FALLEN_OFF_BUS) for u in lost]

    def wait(self, timeout_ms: int) -> list[XidEvent]:
        deadline = time.monotonic() + timeout_ms / 1000
        with self._machine.changed:
            while True:
                events = self._collect()
                left = deadline - time.monotonic()
                if events or left <= 0:
                    return events
                self._machine.changed.wait(left)

    def close(self) -> None:
        self._uuids = []
