"""The machine's CPU use over a test run, printed in its summary.

Why this module exists: the cluster tiers run in parallel workers
(pytest-xdist), and how many is chosen from how busy the two cores are over
the tier: a tier that leaves a core idle can take another worker, one that
keeps both busy cannot (its tests would only wait longer for each other).
It reads ``/proc/stat`` (all CPUs: the control planes, node agents and
plugins the tests start count too) at the start and the end of the run;
the figure is a measurement, nothing asserts on it.
"""

from __future__ import annotations

import os
import time

_START: list[tuple[float, int, int]] = []


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def start() -> None:
    try:
        busy, total = _cpu_ticks()
    except OSError:
        return
    _START[:] = [(time.monotonic(), busy, total)]


def summary(workers: int) -> str:
    """One line: wall time, and the CPU use of the whole machine meanwhile."""
    if not _START:
        return ""
    t0, busy0, total0 = _START[0]
    busy, total = _cpu_ticks()
    cores = os.cpu_count() or 1
    share = 100.0 * (busy - busy0) / max(1, total - total0)
    return (
        f"machine load over this run: {time.monotonic() - t0:.0f} s wall, CPU {share:.0f} % "
        f"of {cores} cores busy, {workers} pytest worker(s)"
    )
