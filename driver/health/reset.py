"""Resetting a GPU on the node: ``nvidia-smi --gpu-reset``, and the NVML
reads around it.

Why: a GPU whose failure a reset cures stays out of service until someone
resets it, and the plugin is the one process on the node that knows when no
claim uses the GPU any more. A reset needs root and no process on the GPU,
monitoring ones included: the plugin's own XID watcher lets go of its event
set and NVML first (:meth:`driver.health.xid.XidWatcher.paused`), and the
plugin's NVML session lock is held so no scan initialises NVML meanwhile.
nvidia-smi refuses a GPU some process holds ("in use by another process"):
that is :attr:`ResetOutcome.IN_USE`, to retry once the holder is gone, not
a failed reset. :class:`NodeGpuOps` is what :mod:`driver.health.recovery`
runs (in worker threads); tests give it a fake NVML and the simulated
host's nvidia-smi (``fabric/simhost/nvidia_smi.py``).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from driver.health.xid import XidWatcher
from driver.nvml.backend import NvmlBackend
from driver.nvml.condition import GpuCondition

log = logging.getLogger(__name__)

RESET_TIMEOUT_S = 300  # a reset takes seconds; a hung nvidia-smi must not hang recovery
IN_USE_MARKERS = ("in use by another", "currently in use", "currently being used")


class ResetOutcome(enum.Enum):
    DONE = "done"
    IN_USE = "in-use"  # refused: a process holds the GPU (retry later)
    FAILED = "failed"


@dataclass(frozen=True)
class ResetResult:
    outcome: ResetOutcome
    message: str = ""


class GpuOps(Protocol):
    """What recovery needs of the node; every call blocks."""

    def bus_id(self, uuid: str) -> str | None: ...
    def processes(self, uuid: str) -> list[int]: ...
    def mig_mode(self, uuid: str) -> bool | None: ...
    def set_mig_mode(self, uuid: str, enabled: bool) -> None: ...
    def condition(self, uuid: str) -> GpuCondition: ...
    def reset(self, uuid: str, bus_id: str) -> ResetResult: ...


def run_gpu_reset(nvidia_smi: Path, bus_id: str) -> ResetResult:
    """``nvidia-smi --gpu-reset -i <bus id>``, its outcome from the exit status and text."""
    argv = [str(nvidia_smi), "--gpu-reset", "-i", bus_id]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=RESET_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ResetResult(ResetOutcome.FAILED, f"{' '.join(argv)}: {exc}")
    text = " ".join((proc.stdout + " " + proc.stderr).split())
    if proc.returncode == 0:
        return ResetResult(ResetOutcome.DONE, text)
    if any(m in text.lower() for m in IN_USE_MARKERS):
        return ResetResult(ResetOutcome.IN_USE, text)
    return ResetResult(ResetOutcome.FAILED, f"exit {proc.returncode}: {text}")


class NodeGpuOps:
    """:class:`GpuOps` over the plugin's NVML backend and nvidia-smi."""

    def __init__(
        self,
        nvml: NvmlBackend,
        nvidia_smi: Path,
        lock: threading.RLock | None = None,
        watcher: XidWatcher | None = None,
    ) -> None:
        self._nvml = nvml
        self._nvidia_smi = nvidia_smi
        self._lock = lock if lock is not None else threading.RLock()
        self.watcher = watcher

    @contextlib.contextmanager
    def _session(self) -> Iterator[NvmlBackend]:
        with self._lock:
            self._nvml.init()
            try:
                yield self._nvml
            finally:
                self._nvml.shutdown()

    def bus_id(self, uuid: str) -> str | None:
        with self._session() as nvml:
            gpu = nvml.gpu(uuid)
        return gpu.pci_bus_id if gpu is not None else None

    def processes(self, uuid: str) -> list[int]:
        with self._session() as nvml:
            return nvml.running_processes(uuid)

    def mig_mode(self, uuid: str) -> bool | None:
        with self._session() as nvml:
            gpu = nvml.gpu(uuid)
        return gpu.mig_mode_current if gpu is not None and gpu.mig_capable else None

    def set_mig_mode(self, uuid: str, enabled: bool) -> None:
        with self._session() as nvml:
            nvml.set_mig_mode(uuid, enabled)

    def condition(self, uuid: str) -> GpuCondition:
        with self._session() as nvml:
            return nvml.condition(uuid)

    def reset(self, uuid: str, bus_id: str) -> ResetResult:
        """The reset, with the XID watcher paused and the NVML lock held."""
        pause = self.watcher.paused() if self.watcher is not None else contextlib.nullcontext()
        with pause, self._lock:
            log.warning("GPU %s (%s): resetting", uuid, bus_id, extra={"device": uuid})
            return run_gpu_reset(self._nvidia_smi, bus_id)
