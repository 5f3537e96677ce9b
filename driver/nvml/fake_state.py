"""The shared "hardware" behind the in-memory NVML fake.

One :class:`FakeMachine` plays the role the state file plays for the C
mock: several :class:`driver.nvml.fake.FakeNvml` instances over the same
machine behave like several processes on one node. Its control methods
mirror what the simulated host can do to the C mock (hot-add/remove, lose a
GPU, queue XIDs, inject failures, reset an Ampere GPU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from driver.nvml.backend import NvmlReturn
from driver.nvml.fake_models import MODELS, ModelFacts

# What NVIDIA's driver records along with an XID (as fabric/simhost/nvml_state.py's
# XID_EFFECTS for the C mock; tests/contract checks both): recovery action, memory facts.
XID_EFFECTS: dict[int, dict[str, int | bool]] = {
    48: {"recovery_action": 1, "ecc_uncorrected": 1},
    63: {"recovery_action": 1, "row_remap_pending": True},
    64: {"recovery_action": 1, "row_remap_failure": True},
    95: {"recovery_action": 1, "ecc_uncorrected": 1},
    119: {"recovery_action": 1},
    154: {"recovery_action": 2},
}


def monotonic_ms() -> int:
    """The clock the C mock's utilization integral runs on (CLOCK_MONOTONIC, ms)."""
    return time.monotonic_ns() // 1_000_000


@dataclass
class Level:
    """A utilization level as tests set it, with its integral over time: the
    C mock's "utilization", "util_busy" and "util_since" (``utilization.c``)."""

    level: int = 0  # percent
    busy: int = 0  # percent x ms up to ``since``
    since: int = 0  # ms

    def set(self, percent: int, now: int) -> None:
        self.busy = self.at(now)
        self.level, self.since = percent, now

    def at(self, now: int) -> int:
        """The integral up to ``now``."""
        return self.busy + min(self.level, 100) * (now - self.since)


@dataclass
class FakeInstance:
    gi_id: int
    profile_id: int
    start: int
    size: int
    cis: dict[int, str] = field(default_factory=dict)  # CI id -> MIG UUID
    util: Level = field(default_factory=Level)  # SM utilization (GPM)


@dataclass
class FakeGpu:
    uuid: str
    model: ModelFacts
    serial: str
    pci_bus_id: str
    minor: int
    mig_current: bool = False
    mig_pending: bool = False
    lost: bool = False
    compute_mode: int = 0  # nvmlComputeMode_t, like the C mock's "compute_mode"
    xids: list[int] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)  # PIDs, like the C mock's "processes"
    # pid -> (sm, memory) percent: the C mock's "process_utilization"
    process_util: dict[int, tuple[int, int]] = field(default_factory=dict)
    # The C mock's "recovery_action" (None: unsupported, its -1), "row_remap_pending",
    # "row_remap_failure", "ecc_uncorrected" (hack/nvml-mock/recovery.c).
    recovery_action: int | None = 0
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    ecc_uncorrected: int = 0
    instances: dict[int, FakeInstance] = field(default_factory=dict)
    util: Level = field(default_factory=Level)  # nvmlDeviceGetUtilizationRates
    memory_utilization: int = 0


@dataclass
class Failure:
    function: str
    error: NvmlReturn
    remaining: int  # < 0: always
    gpu: str | None = None


class FakeMachine:
    """GPUs and injected failures shared by every FakeNvml on this 'node'."""

    def __init__(
        self,
        driver_version: str = "580.82.07",
        cuda_driver_version: str = "13.0",
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.clock = clock  # ms, for utilization (the C mock's CLOCK_MONOTONIC)
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.gpus: dict[str, FakeGpu] = {}
        self.failures: list[Failure] = []
        self.changed = threading.Condition()

    def add_gpu(
        self,
        uuid: str,
        model: str,
        pci_bus_id: str,
        *,
        serial: str = "",
        minor: int | None = None,
        mig: bool = False,
    ) -> None:
        with self.changed:
            self.gpus[uuid] = FakeGpu(
                uuid=uuid,
                model=MODELS[model],
                serial=serial or f"SN{len(self.gpus):010d}",
                pci_bus_id=pci_bus_id.lower(),
                minor=len(self.gpus) if minor is None else minor,
                mig_current=mig,
                mig_pending=mig,
            )
            self.changed.notify_all()

    def remove_gpu(self, uuid: str) -> None:
        with self.changed:
            del self.gpus[uuid]
            self.changed.notify_all()

    def set_lost(self, uuid: str, lost: bool = True) -> None:
        with self.changed:
            self.gpus[uuid].lost = lost
            self.changed.notify_all()

    def set_processes(self, uuid: str, pids: list[int]) -> None:
        """The processes running on the GPU (a container's CUDA process, say)."""
        with self.changed:
            self.gpus[uuid].processes = sorted(pids)
            self.changed.notify_all()

    def set_process_utilization(self, uuid: str, samples: dict[int, tuple[int, int]]) -> None:
        """Each process's (SM, memory) utilization on the GPU from now on, percent
        (``nvmlDeviceGetProcessUtilization``); an empty dict: no samples."""
        with self.changed:
            self.gpus[uuid].process_util = dict(samples)
            self.changed.notify_all()

    def set_utilization(
        self, uuid: str, percent: int, *, gi_id: int | None = None, memory: int | None = None
    ) -> None:
        """How busy the GPU (or its GPU instance ``gi_id``) is from now on, percent."""
        with self.changed:
            gpu = self.gpus[uuid]
            target = gpu.util if gi_id is None else gpu.instances[gi_id].util
            target.set(percent, self.clock())
            if memory is not None:
                gpu.memory_utilization = memory
            self.changed.notify_all()

    def queue_xid(self, uuid: str, xid: int) -> None:
        """The GPU raises ``xid``, with what the driver records with it (XID_EFFECTS)."""
        with self.changed:
            gpu = self.gpus[uuid]
            gpu.xids.append(xid)
            effects = XID_EFFECTS.get(xid, {})
            if "recovery_action" in effects and gpu.recovery_action is not None:
                gpu.recovery_action = int(effects["recovery_action"])
            gpu.ecc_uncorrected += int(effects.get("ecc_uncorrected", 0))
            gpu.row_remap_pending |= bool(effects.get("row_remap_pending", False))
            gpu.row_remap_failure |= bool(effects.get("row_remap_failure", False))
            self.changed.notify_all()

    def set_condition(
        self,
        uuid: str,
        *,
        recovery_action: int | None = 0,
        row_remap_pending: bool = False,
        row_remap_failure: bool = False,
        ecc_uncorrected: int = 0,
    ) -> None:
        """What NVML reports of the GPU's condition (a failure raises it)."""
        with self.changed:
            gpu = self.gpus[uuid]
            gpu.recovery_action = recovery_action
            gpu.row_remap_pending = row_remap_pending
            gpu.row_remap_failure = row_remap_failure
            gpu.ecc_uncorrected = ecc_uncorrected
            self.changed.notify_all()

    def reset_gpu(self, uuid: str) -> None:
        """A GPU reset, as the C mock's host does it (``NvmlStateFile.reset_gpu``):
        a pending MIG mode takes effect, MIG instances are gone, a pending row
        remap is applied, the volatile ECC count and the recovery action clear
        (a failed remap stays: the hardware is out of spare rows)."""
        with self.changed:
            gpu = self.gpus[uuid]
            gpu.mig_current = gpu.mig_pending
            gpu.instances.clear()
            gpu.row_remap_pending = False
            gpu.ecc_uncorrected = 0
            if gpu.recovery_action is not None:
                gpu.recovery_action = 0
            self.changed.notify_all()

    def inject_failure(
        self, function: str, error: str, times: int = 1, gpu: str | None = None
    ) -> None:
        """Make NVML entry point ``function`` fail with ``error`` (times < 0: always)."""
        with self.changed:
            self.failures.append(Failure(function, NvmlReturn[error], times, gpu))

    def take_failure(self, function: str, uuid: str | None) -> NvmlReturn | None:
        with self.changed:
            for f in self.failures:
                if f.function != function or (f.gpu is not None and f.gpu != uuid):
                    continue
                if f.remaining > 0:
                    f.remaining -= 1
                    if f.remaining == 0:
                        self.failures.remove(f)
                return f.error
        return None
