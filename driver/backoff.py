"""Exponential backoff for retry loops: the one policy every loop shares.

A delay starts at ``start``, doubles after each failure up to ``cap`` and
goes back to ``start`` after a success. Loops on the asyncio loop await
:meth:`Backoff.sleep`; a thread waits on its own stop event for
:meth:`Backoff.next` seconds.
"""

from __future__ import annotations

import asyncio


class Backoff:
    def __init__(self, start: float = 0.2, cap: float = 30.0) -> None:
        self.start = start
        self.cap = cap
        self.delay = start  # the wait before the next retry

    def next(self) -> float:
        """The delay to wait now; the one after it is doubled (up to ``cap``)."""
        delay = self.delay
        self.delay = min(delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        """After a success: the next failure waits ``start`` again."""
        self.delay = self.start

    async def sleep(self) -> None:
        await asyncio.sleep(self.next())
