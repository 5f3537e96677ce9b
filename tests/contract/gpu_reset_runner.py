"""The real reset path, run in a process of its own with pynvml over the C
mock (``tests/contract/test_gpu_reset.py`` starts it): the XID watcher holds
the GPU through its event set, the simulated host's nvidia-smi refuses to
reset a held GPU, :class:`driver.health.reset.NodeGpuOps` pauses the
watcher and the reset goes through, clearing what the health check reads.

Usage: ``python -m tests.contract.gpu_reset_runner <host dir>``; exits 0
when every step held, else an AssertionError says which did not.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from driver.health.reset import NodeGpuOps, ResetOutcome, run_gpu_reset
from driver.health.xid import XidWatcher
from driver.nvml.condition import RecoveryAction
from driver.nvml.pynvml_backend import PynvmlBackend
from fabric.simhost.nvml_state import NvmlStateFile

DEADLINE_S = 60  # a safety net for waits on conditions, not a timing assertion


def wait_for(what: str, changed: threading.Condition, test: object) -> None:
    with changed:
        if not changed.wait_for(test, DEADLINE_S):  # type: ignore[arg-type]
            raise AssertionError(f"never: {what}")


def main(host: Path) -> None:
    state = NvmlStateFile(host / "nvml-state.json")
    smi = host / "bin" / "nvidia-smi"
    nvml = PynvmlBackend()
    nvml.init()
    uuid, other = (g.uuid for g in nvml.gpus()[:2])
    bus = next(g.pci_bus_id for g in nvml.gpus() if g.uuid == uuid)
    seen: list[tuple[str, int]] = []
    changed = threading.Condition()

    def on_xid(u: str, xid: int) -> None:
        with changed:
            seen.append((u, xid))
            changed.notify_all()

    watcher = XidWatcher(nvml, on_xid).start()
    watcher.set_gpus([uuid, other])
    state.queue_xid(uuid, 31)  # delivered once the event set is registered: it holds the GPU
    wait_for("the watcher's event set", changed, lambda: (uuid, 31) in seen)
    (entry,) = (g for g in state.read()["gpus"] if g["uuid"] == uuid)
    assert os.getpid() in entry["holders"]  # the mock lists this process as holding it

    held = run_gpu_reset(smi, bus)  # the watcher holds it: refused, nothing changed
    assert held.outcome is ResetOutcome.IN_USE, held
    assert str(os.getpid()) in held.message

    ops = NodeGpuOps(nvml, smi, watcher=watcher)
    state.set_condition(uuid, recovery_action=RecoveryAction.GPU_RESET,
                        row_remap_pending=True, ecc_uncorrected=2)  # fmt: skip
    assert ops.condition(uuid).problems() != []
    done = ops.reset(uuid, bus)  # pauses the watcher: its event set and NVML let go
    assert done.outcome is ResetOutcome.DONE, done
    assert ops.condition(uuid).problems() == []  # what the health check reads, cleared
    state.queue_xid(uuid, 48)  # the watcher is back after the reset
    wait_for("an XID after the reset", changed, lambda: (uuid, 48) in seen)

    state.set_processes(uuid, [os.getpid()])  # a CUDA process on it
    assert ops.reset(uuid, bus).outcome is ResetOutcome.IN_USE
    state.set_processes(uuid, [])

    state.set_reset_failure(uuid, "Unknown Error")
    failed = ops.reset(uuid, bus)
    assert failed.outcome is ResetOutcome.FAILED and "Unknown Error" in failed.message, failed
    watcher.stop()
    nvml.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
