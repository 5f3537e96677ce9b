"""When the preparer compacts the checkpoint: once it is at rest.

Why a module: a prepare or unprepare appends to the checkpoint's journal
(``driver.journal``), and builds before the journal read only the whole
file, so the file should be current whenever the node is quiet, without a
compaction in the way of a burst of calls. :class:`RestCompaction` starts
one :data:`COMPACT_AT_REST_S` after the last call (each call moves it on),
on the event loop, as a task of its own; the preparer's ``compact`` takes
the claim lock, so a call that arrives meanwhile waits for at most one
whole-file write. Nothing runs while nothing is pending: the plugin at rest
costs no wake-up (docs/figures.md, idle CPU).

Concurrency model: everything here runs on the preparer's asyncio loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

COMPACT_AT_REST_S = 1.0  # no call for this long: the checkpoint is compacted


Compact = Callable[[], Coroutine[Any, Any, None]]


class RestCompaction:
    def __init__(
        self,
        pending: Callable[[], int],
        compact: Compact,
        loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.get_running_loop,
    ) -> None:
        self._pending = pending  # journal entries the file lacks (CheckpointStore.pending)
        self._compact = compact
        self._timer: asyncio.TimerHandle | None = None
        # The calls' loop (the preparer's, taken once: a lookup reads the
        # process id on 3.11, and every call ends here once the journal is on).
        self._loop = loop
        self._tasks: set[asyncio.Task[None]] = set()
        self.ran = asyncio.Event()  # set once a compaction at rest has ended (tests)

    def after_call(self) -> None:
        """A call ended: compact once none came for :data:`COMPACT_AT_REST_S`."""
        self.cancel()
        if self._pending() == 0:
            return
        self._timer = self._loop().call_later(COMPACT_AT_REST_S, self._start)

    def cancel(self) -> None:
        """Forget a compaction not yet started (one is being done now)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _start(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._compact())
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.ran.set()
