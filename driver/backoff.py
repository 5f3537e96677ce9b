"""Exponential backoff with jitter for retry loops: the one policy every loop shares.

A base delay starts at ``start``, doubles after each failure up to ``cap``
and goes back to ``start`` after a success. Each wait is the base stretched
at random by up to ``jitter`` of itself, as client-go's ``wait.Jitter``
does (``base * (1 + random * jitter)``): many processes that failed
together (every node's watch in one apiserver outage) then retry spread
out, not in lockstep. ``jitter=0`` waits exactly the base. Loops on the
asyncio loop await :meth:`Backoff.sleep`; a thread waits on its own stop
event for :meth:`Backoff.next` seconds.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable


def jittered(delay: float, factor: float, rand: Callable[[], float] = random.random) -> float:
    """client-go's ``wait.Jitter``: ``delay`` plus up to ``factor`` of it at random."""
    if factor <= 0:
        return delay
    return delay * (1 + rand() * factor)


class Backoff:
    def __init__(
        self,
        start: float = 0.2,
        cap: float = 30.0,
        jitter: float = 0.0,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if jitter < 0:
            raise ValueError(f"jitter must be >= 0, not {jitter}")
        self.start = start
        self.cap = cap
        self.jitter = jitter
        self._rand = rand  # [0, 1): injected by tests
        self.delay = start  # the base of the next wait, before jitter

    def next(self) -> float:
        """The delay to wait now (jittered); the base after it is doubled (up to ``cap``)."""
        delay = self.delay
        self.delay = min(delay * 2, self.cap)
        return jittered(delay, self.jitter, self._rand)

    def reset(self) -> None:
        """After a success: the next failure waits ``start`` again."""
        self.delay = self.start

    async def sleep(self) -> None:
        await asyncio.sleep(self.next())
