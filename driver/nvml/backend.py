"""The NVML interface the driver programs against, and its data types.

Two implementations satisfy :class:`NvmlBackend`: ``pynvml_backend`` (the
real ``pynvml``, which loads ``libnvidia-ml.so.1`` - the real library or our C
mock) and ``fake`` (in memory, for fast unit tests). The contract suite in
``tests/contract`` runs the same scenarios against both so they cannot drift.

All methods block; async callers run them in a worker thread. Failures raise
:class:`driver.errors.NvmlError` (enumeration) or
:class:`driver.errors.NvmlDeviceError` (changes), carrying NVML's return code
name, e.g. ``INSUFFICIENT_RESOURCES`` for an occupied MIG placement.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from driver.errors import NvmlDeviceError, NvmlError
from driver.metrics import NVML_ERRORS
from driver.nvml.condition import GpuCondition


class NvmlReturn(enum.IntEnum):
    """The ``nvmlReturn_t`` codes we meet (names as NVML spells them)."""

    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    IN_USE = 19
    MEMORY = 20
    INSUFFICIENT_RESOURCES = 23
    ARGUMENT_VERSION_MISMATCH = 25
    INVALID_STATE = 29
    UNKNOWN = 999


def nvml_error(code: int, message: str = "", *, device: bool = False) -> NvmlError:
    """The exception for an NVML return code (``device``: a change failed)."""
    try:
        name = NvmlReturn(code).name
    except ValueError:
        name = f"ERROR_{code}"
    cls = NvmlDeviceError if device else NvmlError
    return cls(code, name, message or name)


class ComputeMode(enum.IntEnum):
    """``nvmlComputeMode_t``: who may create contexts on a GPU (MPS needs
    EXCLUSIVE_PROCESS: the MPS server is then the one process)."""

    DEFAULT = 0
    EXCLUSIVE_THREAD = 1  # "support removed": setting it is NOT_SUPPORTED
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


XID_FALLEN_OFF_BUS = 79
"""The XID the kernel logs when a GPU falls off the bus; reported for lost GPUs."""


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str  # "580.82.07"
    cuda_driver_version: str  # "13.0"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    minor: int
    uuid: str
    serial: str
    product_name: str  # "NVIDIA H100 80GB HBM3"
    brand: str  # "Nvidia", "Tesla", ...
    architecture: str  # "ampere", "hopper", ...
    cuda_compute_capability: str  # "9.0"
    memory_bytes: int
    pci_bus_id: str  # "0000:3b:00.0"
    mig_capable: bool
    mig_mode_current: bool
    mig_mode_pending: bool


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile and where it may be placed."""

    profile_id: int  # NVML GI profile id (19, 20, 15, 14, 9, 5, 0)
    name: str  # "3g.40gb"
    compute_slices: int
    memory_slots: int
    memory_mib: int
    multiprocessors: int
    media_engines: bool  # holds the GPU's OFA/media engines (+me and 7g)
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slots
    max_count: int


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance and (normally) its one compute instance / MIG device."""

    gi_id: int
    profile_id: int
    start: int
    size: int
    ci_id: int | None  # None: a GI without compute instance (half-created)
    mig_uuid: str | None


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int


GPM_ARCHITECTURES = frozenset({"hopper", "blackwell"})
"""Architectures with GPM (GPU Performance Monitoring): a MIG device's utilization."""


@dataclass(frozen=True)
class ProcessUtilization:
    """One ``nvmlProcessUtilizationSample_t``: a process's share of the GPU."""

    pid: int
    sm: int  # percent
    memory: int  # percent
    timestamp: int  # microseconds (CPU clock)


class GpmSample(Protocol):
    """One GPM sample of a MIG GPU instance (opaque); two give a utilization."""

    def close(self) -> None:
        """Free it (NVML allocated it); closing twice is harmless."""
        ...


class EventWatcher(Protocol):
    def wait(self, timeout_ms: int) -> list[XidEvent]:
        """XIDs that arrived within ``timeout_ms`` (empty on timeout)."""
        ...

    def close(self) -> None: ...


class NvmlBackend(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def system_info(self) -> SystemInfo: ...
    def gpus(self) -> list[GpuInfo]:
        """Every reachable GPU in NVML index order (lost GPUs are left out)."""
        ...

    def gpu(self, uuid: str) -> GpuInfo | None:
        """One GPU by UUID (one handle lookup, not an enumeration); None when
        NVML does not know it (since its init) or it is lost."""
        ...

    def set_mig_mode(self, uuid: str, enabled: bool) -> tuple[bool, bool]:
        """Ask for MIG on/off; returns (current, pending) afterwards."""
        ...

    def mig_profiles(self, uuid: str) -> list[MigProfile]: ...
    def mig_instances(self, uuid: str) -> list[MigInstance]: ...
    def create_gpu_instance(self, uuid: str, profile_id: int, start: int) -> int:
        """Only the GPU instance at (profile, start); its GI id (a crash may follow)."""
        ...

    def create_compute_instance(self, uuid: str, gi_id: int) -> MigInstance:
        """One compute instance using all of GI ``gi_id``; the GI is left on failure."""
        ...

    def destroy_mig(self, uuid: str, gi_id: int) -> None:
        """Destroy a GI's compute instances, then the GI; a missing GI is not an error."""
        ...

    def watch_events(self, uuids: Sequence[str]) -> EventWatcher: ...
    def compute_mode(self, uuid: str) -> int:
        """The GPU's ``nvmlComputeMode_t`` (a :class:`ComputeMode` value)."""
        ...

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        """Set it (takes effect at once; NOT_SUPPORTED on a GPU with MIG on,
        INVALID_ARGUMENT for a value outside ``nvmlComputeMode_t``)."""
        ...

    def running_processes(self, uuid: str) -> list[int]:
        """PIDs of the compute and graphics processes on the GPU (on any of its
        MIG devices too), sorted: what holds it besides our claims."""
        ...

    def process_utilization(self, uuid: str) -> list[ProcessUtilization]:
        """Per-process samples on the GPU (``nvmlDeviceGetProcessUtilization``,
        every sample NVML still holds; none: an empty list); NOT_SUPPORTED
        where NVML cannot tell them (MIG enabled, some GPUs)."""
        ...

    def condition(self, uuid: str) -> GpuCondition:
        """Recovery action, row remapper, uncorrectable ECC (:mod:`driver.nvml.condition`)."""
        ...

    def utilization(self, uuid: str) -> int:
        """The whole GPU's utilization, percent (``nvmlDeviceGetUtilizationRates``);
        NOT_SUPPORTED while MIG is enabled on it."""
        ...

    def mig_sample(self, uuid: str, gi_id: int) -> GpmSample:
        """A GPM sample of GPU instance ``gi_id`` of GPU ``uuid``
        (``nvmlGpmMigSampleGet``); NOT_SUPPORTED before Hopper or with MIG
        off, NOT_FOUND for a GPU instance that does not exist."""
        ...

    def mig_utilization(self, first: GpmSample, second: GpmSample) -> float:
        """SM utilization, percent, between two samples of one GPU instance
        (``nvmlGpmMetricsGet``, ``NVML_GPM_METRIC_SM_UTIL``)."""
        ...


def short_profile_name(nvml_name: str) -> str:
    """NVML names profiles "MIG 3g.40gb"; we use "3g.40gb"."""
    return nvml_name.removeprefix("MIG ").strip()


BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}


def normalize_bus_id(raw: str) -> str:
    """NVML's "00000000:3B:00.0" as sysfs spells it: "0000:3b:00.0"."""
    domain, bus, rest = raw.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def cuda_version(raw: int) -> str:
    """NVML's 13000 as "13.0"."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


C = TypeVar("C", bound=type)
_depth = threading.local()


def counts_errors(cls: C) -> C:
    """Count each :class:`NvmlError` that leaves a public method of ``cls``
    (``patchbay_nvml_errors_total{call, code}``): the failures the driver
    sees, not those a backend handles itself (a TIMEOUT that ends an event
    wait, NOT_SUPPORTED of an optional query). Only the outermost call of a
    thread counts, so a method calling another counts once."""

    def wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_depth, "n", 0)
            _depth.n = depth + 1
            try:
                return method(*args, **kwargs)
            except NvmlError as exc:
                if depth == 0:
                    NVML_ERRORS.labels(call=name, code=exc.name).inc()
                raise
            finally:
                _depth.n = depth

        return counted

    for name, method in list(vars(cls).items()):
        if not name.startswith("_") and callable(method):
            setattr(cls, name, wrap(name, method))
    return cls
