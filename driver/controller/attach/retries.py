"""When a request the fabric refused may be asked again: per device, backing off.

Why: a detach the fabric refuses (409: the device has running work, or its
connection is still attaching) or that fails is asked again by a later
reconciler pass. Asked at a fixed 1 s, that was once a second for as long
as the cause lasted (issue 33: 44 s of 409s for one stuck connection, each
one a DetachFailed occurrence). Each device's refusals now back off as
client-go's workqueue rate limiter does per item: exponential from
``RETRY_START_S`` (doubling), jittered (``driver.backoff``: up to
``RETRY_JITTER`` of the delay more), capped at ``RETRY_CAP_S``, and reset by
a request that succeeds. There is no last try: a device left attached
would leak, so the retries go on at the cap, and a pass that comes while a
device waits leaves it alone. The device stays free meanwhile (an attach
of it is not held up); a timer wakes the caller when the wait ends.

Monotonic time only (``clock``, injected by tests with ``rand``).
Concurrency: the controller's asyncio loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from driver.backoff import Backoff

RETRY_START_S = 1.0
RETRY_CAP_S = 60.0
RETRY_JITTER = 0.5


class Retries:
    """Refused requests per key (a device id) and when each may be asked again."""

    def __init__(
        self,
        wake: Callable[[], None],
        start: float = RETRY_START_S,
        cap: float = RETRY_CAP_S,
        jitter: float = RETRY_JITTER,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._wake = wake
        self._policy = (start, cap, jitter)
        self._clock = clock
        self._rand = rand
        self._backoff: dict[str, Backoff] = {}
        self._due: dict[str, float] = {}  # key -> when it may be asked again (clock)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def due(self, key: str) -> bool:
        """Whether ``key`` may be asked now (never refused, or its wait is over)."""
        return self.wait(key) <= 0

    def wait(self, key: str) -> float:
        """Seconds until ``key`` may be asked again (0: now)."""
        due = self._due.get(key)
        return 0.0 if due is None else max(0.0, due - self._clock())

    def refused(self, key: str) -> float:
        """``key`` was refused now: its next wait (seconds), after which ``wake`` runs."""
        backoff = self._backoff.get(key)
        if backoff is None:
            start, cap, jitter = self._policy
            backoff = self._backoff[key] = Backoff(start, cap, jitter, self._rand)
        delay = backoff.next()
        self._due[key] = self._clock() + delay
        self._cancel(key)
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._wake)
        return delay

    def succeeded(self, key: str) -> None:
        """``key`` was done: the next refusal waits ``start`` again."""
        self._backoff.pop(key, None)
        self._due.pop(key, None)
        self._cancel(key)

    def close(self) -> None:
        """Cancel every pending wake-up (the workers stop)."""
        for key in list(self._timers):
            self._cancel(key)

    def _cancel(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
