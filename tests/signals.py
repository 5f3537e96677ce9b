"""Bounded waits on a signal: what an in-process test does instead of sleeping.

Why: a test that sleeps a fixed time and then asserts that nothing happened
passes on a slow machine for the wrong reason; one that sleeps and then
counts asserts the machine's speed (``hack/sleep_lint.py`` keeps such sleeps
out). A test waits instead, for a bounded time, on the signal that would
show the thing happening: :class:`Signal` wakes a waiter on the event loop
whenever something it watches changes (from any thread), and
:class:`LogSignal` is one fed by the log records of one logger.
Where the kernel gives no change notice (:func:`waiting_in_flock`), the
wait polls the state that shows it, still bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class Signal:
    """Wakes :meth:`until` on the loop it was made on; :meth:`changed` may be
    called from any thread."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def changed(self) -> None:
        self._loop.call_soon_threadsafe(self._event.set)

    async def until(self, what: str, done: Callable[[], bool], within: float = 5.0) -> None:
        """Return once ``done()``, checked after each change; fail naming ``what``
        after ``within`` seconds without it."""
        try:
            async with asyncio.timeout(within):
                while not done():
                    await self._event.wait()
                    self._event.clear()
        except TimeoutError:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}") from None


class LogSignal(logging.Handler):
    """The messages one logger emits (at ``level`` and above), as a signal."""

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.messages: list[str] = []
        self.signal = Signal()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.signal.changed()

    async def until_logged(self, text: str, within: float = 5.0) -> str:
        """The first message holding ``text``, waiting up to ``within`` seconds."""

        def found() -> bool:
            return any(text in m for m in self.messages)

        await self.signal.until(f"a log line holding {text!r}", found, within)
        return next(m for m in self.messages if text in m)

    @classmethod
    @contextmanager
    def on(cls, logger: str, level: int = logging.DEBUG) -> Iterator[LogSignal]:
        """Attached to ``logger`` (its level lowered to ``level``) while in use."""
        target = logging.getLogger(logger)
        handler, old_level = cls(level), target.level
        target.addHandler(handler)
        target.setLevel(min(level, target.getEffectiveLevel()))
        try:
            yield handler
        finally:
            target.removeHandler(handler)
            target.setLevel(old_level)


async def waiting_in_flock(path: Path) -> None:
    """Until this process waits for ``path``'s flock: the kernel lists a blocked
    waiter in /proc/locks (``N: -> FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode>``),
    so the test knows the lock was asked for and refused, at any speed."""

    def waiting() -> bool:
        st = path.stat()
        file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        want = ["->", "FLOCK", "ADVISORY", "WRITE", str(os.getpid()), file]
        lines = Path("/proc/locks").read_text().splitlines()
        return any(line.split()[1:7] == want for line in lines)

    async with asyncio.timeout(5):
        for _ in itertools.count():
            if waiting():
                return
            await asyncio.sleep(0.01)  # poll: /proc/locks has no change notice
