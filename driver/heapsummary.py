"""Where a long-running process's Python memory goes: a heap summary on SIGUSR2.

Resident memory alone cannot tell a leak (objects that pile up) from an
allocator that keeps freed arenas or from caches that fill once. Started
with Python's own allocation tracing on (``PYTHONTRACEMALLOC=<frames>`` in
its environment, or ``-X tracemalloc``), every patchbay process logs, when
it is sent SIGUSR2, the memory tracing sees and the allocation sites that
grew most since its previous summary (the first time: the largest ones).
With tracing off the signal logs how to turn it on; nothing else changes.
Tracing costs CPU and memory of its own, so it is for a diagnosis, never
for the figures: ``make bench BENCH=soak SOAK_HEAP=1`` (``tests/bench/soak_bench.py``)
uses it for the plugins and the controller; on a cluster, add the variable
to the chart's ``kubeletPlugin.extraEnv`` or ``controller.extraEnv`` and send
the process SIGUSR2; the summary is in its log.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import tracemalloc

log = logging.getLogger(__name__)

TOP = 12  # allocation sites per summary
_previous: list[tracemalloc.Snapshot] = []  # the last summary's snapshot


def summary(top: int = TOP) -> list[str]:
    """The lines of one summary (and the snapshot kept for the next one)."""
    if not tracemalloc.is_tracing():
        return ["allocation tracing is off: start the process with PYTHONTRACEMALLOC=1"]
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),)
    )
    current, peak = tracemalloc.get_traced_memory()
    lines = [f"traced {current / 1e6:.2f} MB (peak {peak / 1e6:.2f} MB)"]
    if _previous:
        for d in snapshot.compare_to(_previous[0], "lineno")[:top]:
            lines.append(
                f"{d.size_diff / 1e3:+.1f} kB ({d.count_diff:+d} blocks) to "
                f"{d.size / 1e3:.1f} kB at {d.traceback[0]}"
            )
    else:
        for s in snapshot.statistics("lineno")[:top]:
            lines.append(f"{s.size / 1e3:.1f} kB ({s.count} blocks) at {s.traceback[0]}")
    _previous[:] = [snapshot]
    return lines


def log_summary() -> None:
    for line in summary():
        log.info("heap: %s", line)


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Log a summary on SIGUSR2 (on the loop: a snapshot is taken between callbacks)."""
    loop.add_signal_handler(signal.SIGUSR2, log_summary)
