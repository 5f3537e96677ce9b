"""The two worlds a contract scenario runs in.

A *world* gives a scenario NVML backends and the levers a simulated host
has (hot-add/remove, lose a GPU, queue XIDs, inject failures, reset a GPU).
``FakeWorld`` is the in-memory fake; ``MockWorld`` is the real pynvml over
our C mock, living in a subprocess started with ``LD_LIBRARY_PATH`` pointing
at the mock and its levers editing the state file the way the simulated
host does. ``other_process`` runs one backend call in a separate "process"
(a real one for the mock) and returns the result as plain data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from driver.nvml.backend import NvmlBackend
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from fabric.simhost.nvml_state import NvmlStateFile, empty_state, gpu_entry

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SimGpu:
    uuid: str
    model: str
    bdf: str
    serial: str
    minor: int


def plain(value: Any) -> Any:
    """Dataclasses/tuples as JSON-shaped data, so results compare across processes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class World(Protocol):
    def backend(self) -> NvmlBackend: ...
    def other_process(self, method: str, *args: Any) -> Any: ...
    def add_gpu(self, gpu: SimGpu) -> None: ...
    def remove_gpu(self, uuid: str) -> None: ...
    def set_lost(self, uuid: str) -> None: ...
    def queue_xid(self, uuid: str, xid: int) -> None: ...
    def set_processes(self, uuid: str, pids: list[int]) -> None: ...
    def reset_gpu(self, uuid: str) -> None: ...
    def set_condition(self, uuid: str, **facts: Any) -> None: ...
    def set_utilization(self, uuid: str, percent: int, gi_id: int | None = None) -> None: ...
    def set_process_utilization(self, uuid: str, samples: dict[int, tuple[int, int]]) -> None: ...
    def inject_failure(
        self, function: str, error: str, times: int = 1, gpu: str | None = None
    ) -> None: ...


class FakeWorld:
    def __init__(self, gpus: list[SimGpu]) -> None:
        self.machine = FakeMachine()
        for g in gpus:
            self.add_gpu(g)

    def backend(self) -> NvmlBackend:
        return FakeNvml(self.machine)

    def other_process(self, method: str, *args: Any) -> Any:
        other = FakeNvml(self.machine)
        other.init()
        try:
            return plain(getattr(other, method)(*args))
        finally:
            other.shutdown()

    def add_gpu(self, gpu: SimGpu) -> None:
        self.machine.add_gpu(gpu.uuid, gpu.model, gpu.bdf, serial=gpu.serial, minor=gpu.minor)

    def remove_gpu(self, uuid: str) -> None:
        self.machine.remove_gpu(uuid)

    def set_lost(self, uuid: str) -> None:
        self.machine.set_lost(uuid)

    def queue_xid(self, uuid: str, xid: int) -> None:
        self.machine.queue_xid(uuid, xid)

    def set_processes(self, uuid: str, pids: list[int]) -> None:
        self.machine.set_processes(uuid, pids)

    def reset_gpu(self, uuid: str) -> None:
        self.machine.reset_gpu(uuid)

    def set_condition(self, uuid: str, **facts: Any) -> None:
        self.machine.set_condition(uuid, **facts)

    def set_utilization(self, uuid: str, percent: int, gi_id: int | None = None) -> None:
        self.machine.set_utilization(uuid, percent, gi_id=gi_id)

    def set_process_utilization(self, uuid: str, samples: dict[int, tuple[int, int]]) -> None:
        self.machine.set_process_utilization(uuid, samples)

    def inject_failure(
        self, function: str, error: str, times: int = 1, gpu: str | None = None
    ) -> None:
        self.machine.inject_failure(function, error, times, gpu)


def write_state(path: Path, gpus: list[SimGpu]) -> None:
    state = empty_state()
    state["gpus"] = [gpu_entry(g.uuid, g.model, g.bdf, g.serial, g.minor) for g in gpus]
    NvmlStateFile(path).update(lambda s: s.update(state))


def mock_env(lib_dir: Path, state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LD_LIBRARY_PATH=str(lib_dir),
        PATCHBAY_NVML_STATE=str(state),
        PYTHONPATH=str(REPO),
    )
    env.pop("PATCHBAY_NVML_LIBRARY", None)
    return env


def run_in_mock(lib_dir: Path, state: Path, module: str, *args: str) -> None:
    """Run ``python -m module args`` over the C mock (pynvml loads it by
    soname) and fail with its output unless it exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=mock_env(lib_dir, state),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{module} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


class MockWorld:
    """Used inside the scenario subprocess (see ``runner.py``)."""

    def __init__(self, state: Path) -> None:
        self.state = NvmlStateFile(state)

    def backend(self) -> NvmlBackend:
        from driver.nvml.pynvml_backend import PynvmlBackend  # pynvml only in the subprocess

        return PynvmlBackend()

    def other_process(self, method: str, *args: Any) -> Any:
        out = subprocess.run(
            [sys.executable, "-m", "tests.contract.runner", "--call", method, json.dumps(args)],
            env=dict(os.environ),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)

    def add_gpu(self, gpu: SimGpu) -> None:
        self.state.add_gpu(gpu_entry(gpu.uuid, gpu.model, gpu.bdf, gpu.serial, gpu.minor))

    def remove_gpu(self, uuid: str) -> None:
        self.state.remove_gpu(uuid)

    def set_lost(self, uuid: str) -> None:
        self.state.set_lost(uuid)

    def queue_xid(self, uuid: str, xid: int) -> None:
        self.state.queue_xid(uuid, xid)

    def set_processes(self, uuid: str, pids: list[int]) -> None:
        self.state.set_processes(uuid, pids)

    def reset_gpu(self, uuid: str) -> None:
        self.state.reset_gpu(uuid)

    def set_condition(self, uuid: str, **facts: Any) -> None:
        self.state.set_condition(uuid, **facts)

    def set_utilization(self, uuid: str, percent: int, gi_id: int | None = None) -> None:
        self.state.set_utilization(uuid, percent, gi_id=gi_id)

    def set_process_utilization(self, uuid: str, samples: dict[int, tuple[int, int]]) -> None:
        self.state.set_process_utilization(uuid, samples)

    def inject_failure(
        self, function: str, error: str, times: int = 1, gpu: str | None = None
    ) -> None:
        self.state.inject_failure(function, error, times, gpu)
