"""GPU sharing as a claim asks for it: the opaque GpuConfig with a sharing
block (MPS settings among them), and the MPS daemons a prepare started.

Why: the unit and process tests of time-slicing and MPS, and the MPS
hand-off tests, write the same configs and look for the same daemons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.config.opaque import API_VERSION
from driver.gpu.sharing.mps import start_time


def gpu_config(sharing: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    params = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}
    return {"requests": requests or [], "opaque": {"driver": "patchbay.dev", "parameters": params}}


MPS = {"strategy": "MPS", "mpsConfig": {
    "defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "2Gi"}}  # fmt: skip


def daemons_of(root: Path) -> list[int]:
    """Live processes started with a pipe directory under ``root``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            alive = start_time(int(proc.name)) is not None
            if alive and str(root).encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found
