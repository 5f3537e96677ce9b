"""Hot-removes of GPUs in use: what a simulated host records so tests fail.

Why: a real host does not refuse to hot-remove a GPU that a process or a MIG
instance still uses; the kernel logs XID 79 ("fallen off the bus") and the
remove goes ahead, and the workloads on it die or hang. The simulated host
removes it too (as the real one would), but keeps a record, so that a test
that let the controller detach a GPU in use fails even though every call
succeeded (issue 34: two pods kept "Running" on a hot-removed GPU).

In use, per the NVML state the C mock serves: a GPU instance exists on it,
or a process runs on it (``processes``, ``NvmlStateFile.set_processes``).
Records are JSON lines in ``<host dir>/violations.jsonl``, appended under
the host's lock; :func:`read` returns them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE = "violations.jsonl"


def why_in_use(gpu: Mapping[str, Any]) -> str | None:
    """Why the NVML state's GPU entry ``gpu`` is in use, None when it is not."""
    instances = gpu.get("gpu_instances") or []
    pids = gpu.get("processes") or []
    reasons = []
    if instances:
        reasons.append(f"{len(instances)} MIG instances")
    if pids:
        reasons.append(f"processes {', '.join(map(str, pids))}")
    return " and ".join(reasons) or None


def record_gpu_removal(host_dir: Path, host: str, bdf: str, state: Mapping[str, Any]) -> None:
    """Before GPU ``bdf`` leaves the NVML ``state``: a record if it is in use."""
    gpu = next((g for g in state.get("gpus", []) if g.get("pci_bus_id") == bdf), None)
    why = why_in_use(gpu) if gpu is not None else None
    if gpu is None or why is None:
        return
    log.error("%s: GPU %s (%s) hot-removed while in use (%s): XID 79", host, gpu["uuid"], bdf, why)
    entry = {"time": time.time(), "host": host, "bdf": bdf, "uuid": gpu["uuid"], "inUse": why}
    with (host_dir / FILE).open("a", encoding="utf-8") as out:
        out.write(json.dumps(entry, sort_keys=True) + "\n")


def read(host_dir: Path) -> list[dict[str, Any]]:
    """Every removal in use the host recorded, oldest first."""
    try:
        text = (host_dir / FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
