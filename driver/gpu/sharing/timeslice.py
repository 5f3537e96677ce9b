"""Time-slice intervals through ``nvidia-smi compute-policy --set-timeslice``.

NVML has no public call that sets the time-slice interval; NVIDIA's DRA
driver runs ``nvidia-smi``, and so do we, with the binary a setting
(``--nvidia-smi``; the simulated host ships a stand-in that records what it
was told). One call per claim covers all its GPUs (``-i`` takes a list).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path

from driver.errors import DeviceError

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0


class NvidiaSmi:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def set_timeslice(self, uuids: Sequence[str], timeslice: int) -> None:
        """Set the interval class (0 Default, 1 Short, 2 Medium, 3 Long) of ``uuids``."""
        argv = [str(self.binary), "compute-policy", "-i", ",".join(uuids)]
        argv += ["--set-timeslice", str(timeslice)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeviceError(f"{self.binary}: cannot set the time-slice: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise DeviceError(f"nvidia-smi --set-timeslice {timeslice} on {argv[3]}: {why}")
        log.info("time-slice of %s set to %d", argv[3], timeslice)
