"""The NVML mock's state file, as the simulated host (and tests) edit it.

The C mock (``hack/nvml-mock``) reads this JSON at ``nvmlInit`` and on every
call when it changed, and writes MIG changes back. Both sides follow one
discipline: hold an exclusive ``flock`` on ``<state>.lock`` for a
read-modify-write, and replace the file atomically (temporary file, fsync,
rename). The schema is documented in ``hack/nvml-mock/state.c``.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_ENV = "PATCHBAY_NVML_STATE"

State = dict[str, Any]

# The failure rule that stands for "driver not loaded" (times < 0: always).
DRIVER_UNLOADED = {"function": "nvmlInitWithFlags", "error": "DRIVER_NOT_LOADED", "remaining": -1}


def empty_state() -> State:
    return {
        "version": 1,
        "driver_version": "580.82.07",
        "nvml_version": "13.580.82.07",
        "cuda_driver_version": 13000,
        "gpus": [],
        "failures": [],
    }


def gpu_entry(uuid: str, model: str, pci_bus_id: str, serial: str, minor: int) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "model": model,
        "serial": serial,
        "pci_bus_id": pci_bus_id,
        "minor": minor,
        "mig_current": 0,
        "mig_pending": 0,
        "lost": False,
        "xid_queue": [],
        "gpu_instances": [],
    }


# What NVIDIA's driver records along with an XID on the simulated hardware:
# its recovery action (1 GPU reset, 2 node reboot) and the memory facts.
# driver/nvml/fake_state.py keeps the same table (tests/contract checks both).
XID_EFFECTS: dict[int, dict[str, Any]] = {
    48: {"recovery_action": 1, "ecc_uncorrected": 1},  # double-bit ECC
    63: {"recovery_action": 1, "row_remap_pending": True},  # row to remap at reset
    64: {"recovery_action": 1, "row_remap_failure": True},  # out of spare rows
    95: {"recovery_action": 1, "ecc_uncorrected": 1},  # uncontained ECC
    119: {"recovery_action": 1},  # GSP RPC timeout
    154: {"recovery_action": 2},  # recovery action changed: reboot
}


def raise_xid(gpu: dict[str, Any], xid: int) -> None:
    """Queue ``xid`` on the GPU's entry with what the driver records with it."""
    gpu.setdefault("xid_queue", []).append(xid)
    for key, value in XID_EFFECTS.get(xid, {}).items():
        if key == "ecc_uncorrected":
            gpu[key] = gpu.get(key, 0) + value
        elif key != "recovery_action" or gpu.get(key, 0) != -1:  # -1: field unsupported
            gpu[key] = value


def reset_entry(gpu: dict[str, Any]) -> None:
    """What a GPU reset does to the GPU's entry (``NvmlStateFile.reset_gpu``,
    the host's ``nvidia-smi --gpu-reset``)."""
    gpu["mig_current"] = gpu.get("mig_pending", gpu.get("mig_current", 0))
    gpu["gpu_instances"] = []
    gpu["row_remap_pending"] = False
    gpu["ecc_uncorrected"] = 0
    if gpu.get("recovery_action", 0) != -1:
        gpu["recovery_action"] = 0


def set_level(entry: dict[str, Any], percent: int, now_ms: int) -> None:
    """Set a GPU's or GPU instance's utilization level from ``now_ms`` on,
    keeping its integral (``hack/nvml-mock/utilization.c``)."""
    level = min(int(entry.get("utilization", 0)), 100)
    since = int(entry.get("util_since", 0))
    entry["util_busy"] = int(entry.get("util_busy", 0)) + level * (now_ms - since)
    entry["util_since"] = now_ms
    entry["utilization"] = percent


class NvmlStateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> State:
        try:
            data: State = json.loads(self.path.read_text())
        except FileNotFoundError:
            return empty_state()
        return data

    def _write(self, state: State) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)

    def read(self) -> State:
        with self._locked():
            return self._read()

    def update(self, change: Callable[[State], None]) -> State:
        """Read-modify-write under the lock; returns the new state."""
        with self._locked():
            state = self._read()
            change(state)
            self._write(state)
            return state

    def _gpu(self, state: State, uuid: str) -> dict[str, Any]:
        for gpu in state["gpus"]:
            if gpu["uuid"] == uuid:
                found: dict[str, Any] = gpu
                return found
        raise KeyError(f"no GPU {uuid} in {self.path}")

    def add_gpu(self, entry: dict[str, Any]) -> None:
        def change(s: State) -> None:
            s["gpus"] = [g for g in s["gpus"] if g["uuid"] != entry["uuid"]] + [entry]

        self.update(change)

    def remove_gpu(self, uuid: str) -> None:
        self.update(lambda s: s.update(gpus=[g for g in s["gpus"] if g["uuid"] != uuid]))

    @property
    def _hidden_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}.hidden")

    def set_visible(self, pci_bus_id: str, visible: bool) -> bool:
        """Show or hide the GPU at ``pci_bus_id`` from NVML, as its driver
        binding does on a real host (a GPU on vfio-pci is not NVIDIA's to
        list); its entry waits in ``<state>.hidden``. True when it changed."""
        with self._locked():
            state = self._read()
            hidden_path = self._hidden_path
            hidden: dict[str, Any] = (
                json.loads(hidden_path.read_text()) if hidden_path.exists() else {}
            )
            listed = [g for g in state["gpus"] if g["pci_bus_id"] == pci_bus_id]
            if visible and pci_bus_id in hidden and not listed:
                state["gpus"].append(hidden.pop(pci_bus_id))
            elif not visible and listed:
                hidden[pci_bus_id] = listed[0]
                state["gpus"] = [g for g in state["gpus"] if g["pci_bus_id"] != pci_bus_id]
            else:
                return False
            tmp = hidden_path.with_name(f"{hidden_path.name}.tmp.{os.getpid()}")
            tmp.write_text(json.dumps(hidden, indent=1))
            tmp.replace(hidden_path)
            self._write(state)
            return True

    def set_lost(self, uuid: str, lost: bool = True) -> None:
        self.update(lambda s: self._gpu(s, uuid).update(lost=lost))

    def set_processes(self, uuid: str, pids: list[int]) -> None:
        """The processes NVML lists on the GPU (a container's CUDA process holding
        its device node, say); the C mock answers ``nvmlDevice*RunningProcesses``
        from them."""
        self.update(lambda s: self._gpu(s, uuid).update(processes=sorted(pids)))

    def set_process_utilization(self, uuid: str, samples: dict[int, tuple[int, int]]) -> None:
        """Each process's (SM, memory) utilization on the GPU from now on, percent;
        the mock answers ``nvmlDeviceGetProcessUtilization`` from them."""
        entries = [{"pid": p, "sm": sm, "mem": mem} for p, (sm, mem) in sorted(samples.items())]
        self.update(lambda s: self._gpu(s, uuid).update(process_utilization=entries))

    def set_utilization(
        self, uuid: str, percent: int, *, gi_id: int | None = None, memory: int | None = None
    ) -> None:
        """How busy the GPU (or its GPU instance ``gi_id``, a MIG device) is
        from now on, percent; the mock answers ``nvmlDeviceGetUtilizationRates``
        and GPM from it. KeyError when the GPU or the GPU instance does not exist."""
        now = time.monotonic_ns() // 1_000_000

        def change(s: State) -> None:
            gpu = self._gpu(s, uuid)
            entry = gpu
            if gi_id is not None:
                found = [g for g in gpu.get("gpu_instances", []) if g["id"] == gi_id]
                if not found:
                    raise KeyError(f"no GPU instance {gi_id} on {uuid} in {self.path}")
                entry = found[0]
            set_level(entry, percent, now)
            if memory is not None:
                gpu["memory_utilization"] = memory

        self.update(change)

    def queue_xid(self, uuid: str, xid: int) -> None:
        """The GPU raises ``xid``: queued for event sets, with the recovery
        action and memory facts the driver records with it (``XID_EFFECTS``)."""
        self.update(lambda s: raise_xid(self._gpu(s, uuid), xid))

    def set_condition(
        self,
        uuid: str,
        *,
        recovery_action: int | None = 0,
        row_remap_pending: bool = False,
        row_remap_failure: bool = False,
        ecc_uncorrected: int = 0,
    ) -> None:
        """What NVML reports of the GPU's condition (``hack/nvml-mock/recovery.c``;
        ``recovery_action`` None: the field is not supported, the mock's -1)."""
        fields = {
            "recovery_action": -1 if recovery_action is None else recovery_action,
            "row_remap_pending": row_remap_pending,
            "row_remap_failure": row_remap_failure,
            "ecc_uncorrected": ecc_uncorrected,
        }
        self.update(lambda s: self._gpu(s, uuid).update(fields))

    def set_reset_failure(self, uuid: str, message: str) -> None:
        """Make the host's ``nvidia-smi --gpu-reset`` of the GPU fail with
        ``message`` (empty: it succeeds again); the C mock keeps it."""
        self.update(lambda s: self._gpu(s, uuid).update(reset_failure=message))

    def reset_gpu(self, uuid: str) -> None:
        """A GPU reset: a pending MIG mode takes effect (Ampere), MIG instances
        are gone, a pending row remap is applied, the volatile ECC count and
        the recovery action clear (a failed remap stays)."""
        self.update(lambda s: reset_entry(self._gpu(s, uuid)))

    def set_driver_loaded(self, loaded: bool) -> None:
        """The host's NVIDIA kernel module: while unloaded every ``nvmlInit``
        fails with ``DRIVER_NOT_LOADED`` (the C mock and the fake alike)."""

        def change(s: State) -> None:
            rules = [r for r in s.get("failures", []) if r != DRIVER_UNLOADED]
            s["failures"] = rules if loaded else [*rules, dict(DRIVER_UNLOADED)]

        self.update(change)

    def inject_failure(
        self, function: str, error: str, times: int = 1, gpu: str | None = None
    ) -> None:
        """Make ``function`` fail with NVML ``error`` (e.g. "GPU_IS_LOST"); times < 0: always."""
        rule: dict[str, Any] = {"function": function, "error": error, "remaining": times}
        if gpu:
            rule["gpu"] = gpu
        self.update(lambda s: s.setdefault("failures", []).append(rule))
