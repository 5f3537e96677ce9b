"""The node plugin's idle detection: sample, decide, report.

Why: issue 37's controller acts on idle devices (an Event, or reclaim) but
cannot see utilization; the plugin can (NVML). Every ``interval`` seconds
this task reads the utilization of every device a prepared claim holds
(``driver.idle.sources``, ``driver.idle.sampler``), keeps each device's
window (``driver.idle.window``) and writes the device's ``Idle`` condition
on its claim (``driver.idle.conditions``) when the verdict changes:

- ``Idle=True`` once the device has stayed below the threshold for the window;
- ``Idle=False`` (``Busy``, or ``UtilizationUnknown`` when NVML cannot read
  it) once a device reported idle is no longer;
- nothing while a device never reported idle is not idle: a busy claim costs
  no API request, at rest or ever.

A condition written by an earlier plugin process is not known to this one:
devices held when it starts are corrected by their first definite reading
(a reading at or above the threshold, or none, reads the claim once and
writes ``Idle=False`` only where it says ``Idle=True``; a low one waits for
the window and writes ``Idle=True``), so a stale ``Idle=True`` never
outlives a busy device, an idle device does not flap, and a restart costs
one read per busy device, no write. A read or write that fails is retried
with backoff (``driver.backoff``). The gauges
``patchbay_device_utilization_percent`` and ``patchbay_device_idle_seconds``
are read from the windows at scrape time.

Concurrency: one task on the plugin's loop; readings in a worker thread.
Times come from an injected monotonic clock (seconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from driver.backoff import Backoff
from driver.idle import conditions as c
from driver.idle.sources import Held, Source
from driver.idle.window import IdlePolicy, UtilizationWindow, Verdict
from driver.idleterms import BELOW_THRESHOLD, BUSY, UNKNOWN, busy_message, idle_message
from driver.metrics import DEVICE_IDLE_SECONDS, DEVICE_UTILIZATION, Samples

log = logging.getLogger(__name__)

RETRY_CAP_S = 600.0


class Writer(Protocol):
    async def idle_now(self, held: Held) -> bool | None: ...
    async def write(self, held: Held, cond: dict[str, Any]) -> bool: ...


Reader = Callable[[Collection[Source]], Mapping[Source, float | None]]  # blocking


class IdleReporter:
    def __init__(
        self,
        policy: IdlePolicy,
        interval: float,
        read: Reader,
        held: Callable[[], Mapping[Held, Source]],
        writer: Writer,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.policy = policy
        self.interval = interval
        self._read = read
        self._held = held
        self._writer = writer
        self._clock = clock
        self._wall = wall
        self._windows: dict[Held, UtilizationWindow] = {}
        # What the claim says, as far as this process knows: True/False as
        # written; None: held since before this process, not known.
        self._reported: dict[Held, bool | None] = {}
        self._retry: dict[Held, tuple[float, Backoff]] = {}
        self._started = False

    async def run(self) -> None:
        while True:
            await self.round()
            await asyncio.sleep(self.interval)

    async def round(self) -> None:
        """Read every held device once, then write what changed."""
        held = dict(self._held())
        readings = await asyncio.to_thread(self._read, set(held.values())) if held else {}
        now = self._clock()
        for gone in self._windows.keys() - held.keys():
            del self._windows[gone]
            self._reported.pop(gone, None)
            self._retry.pop(gone, None)
        for h, source in held.items():
            if h not in self._windows:
                self._windows[h] = UtilizationWindow(self.policy)
                self._reported[h] = None if not self._started else False
            if source in readings:
                self._windows[h].observe(now, readings[source])
        self._started = True
        for h in list(self._windows):
            await self._report(h, now)

    def wanted(self, h: Held, now: float) -> dict[str, Any] | None:
        """The condition to write for ``h`` now, None when nothing changes."""
        w, reported = self._windows[h], self._reported[h]
        if not w.observed:
            return None  # no reading yet (a MIG device's first round)
        verdict, thr = w.verdict(now), self.policy.threshold
        if verdict is Verdict.IDLE:
            if reported is True:
                return None
            since = c.timestamp(self._wall() - timedelta(seconds=w.low_for(now)))
            highest = w.highest() or 0.0
            message = idle_message(thr, self.policy.window, since, highest)
            return c.condition(True, BELOW_THRESHOLD, message, self._wall())
        if reported is False:
            return None
        if verdict is Verdict.UNKNOWN:
            message = "NVML gives no utilization for this device now: never idle"
            return c.condition(False, UNKNOWN, message, self._wall())
        latest = w.latest or 0.0
        if reported is None and latest < thr:
            return None  # low, not yet for the window: an earlier Idle=True may stand
        return c.condition(False, BUSY, busy_message(latest, thr), self._wall())

    async def _report(self, h: Held, now: float) -> None:
        cond = self.wanted(h, now)
        if cond is None:
            return
        retry = self._retry.get(h)
        if retry is not None and now < retry[0]:
            return
        if self._reported[h] is None and cond["status"] == "False":
            stale = await self._writer.idle_now(h)  # what an earlier process left
            if stale is False:
                self._reported[h] = False
                self._retry.pop(h, None)
                return
            done = stale is True and await self._writer.write(h, cond)
        else:
            done = await self._writer.write(h, cond)
        if done:
            self._reported[h] = cond["status"] == "True"
            self._retry.pop(h, None)
            return
        backoff = retry[1] if retry is not None else Backoff(self.interval, RETRY_CAP_S, 0.2)
        self._retry[h] = (now + backoff.next(), backoff)

    def idle(self) -> set[Held]:
        """The devices whose claims say Idle=True (as written by this process)."""
        return {h for h, r in self._reported.items() if r is True}

    def utilization_samples(self) -> Samples:
        out = []
        for h, w in self._windows.items():
            if w.latest is not None:
                out.append(((h.namespace, h.claim, h.pool, h.device), w.latest))
        return out

    def idle_seconds_samples(self) -> Samples:
        now = self._clock()
        return [((h.namespace, h.claim, h.pool, h.device), w.low_for(now))
                for h, w in self._windows.items()]  # fmt: skip


def export_idle_metrics(reporter: IdleReporter) -> None:
    """Read the utilization and idle-seconds gauges from ``reporter`` at each scrape."""
    DEVICE_UTILIZATION.add_source(reporter, IdleReporter.utilization_samples)
    DEVICE_IDLE_SECONDS.add_source(reporter, IdleReporter.idle_seconds_samples)
