"""Leader election through a coordination.k8s.io Lease, as client-go does it.

Why: two controller replicas may run (rolling updates, HA); only one may
attach, detach and publish. Wall clocks of two machines disagree, so no
replica ever compares the Lease's ``renewTime`` with its own wall clock:
like client-go's ``LeaderElector`` it keeps the record it last observed and
*when*, on its own monotonic clock, it saw that record change; another
holder's lease has expired once ``leaseDurationSeconds`` have passed on that
clock without a change. The holder renews every ``retry_period`` and steps
down once ``renew_deadline`` (shorter than the lease) has passed since the
start of its last successful renewal, so it has stopped before any follower
may take over, whatever the clocks' offsets. Followers try again every
``retry_period`` stretched by up to ``JITTER_FACTOR`` (client-go's
``JitterUntil``). A holder that stops gives the Lease up at once
(client-go's ``ReleaseOnCancel``: holder cleared, ``leaseDurationSeconds``
1), so a follower takes it on its next try. The Lease's resourceVersion
(optimistic concurrency) decides races. Time comes from a :class:`Clock`,
injected by tests.

Concurrency: every method is a coroutine on the controller's loop;
:meth:`LeaderLease.keep` returns as soon as the lease is lost or was not
renewed in time, and :attr:`LeaderLease.leading` is False from then on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from driver.backoff import jittered
from driver.errors import ApiError, ApiStatusError
from driver.kube.client import JsonObj, KubeClient

log = logging.getLogger(__name__)

RETRY_PERIOD_S = 2.0  # client-go's RetryPeriod
JITTER_FACTOR = 1.2  # client-go's JitterFactor
RENEW_SHARE = 2 / 3  # renew deadline : lease duration (client-go's 10 s : 15 s)


class Clock(Protocol):
    """Monotonic time for the lease's expiry, wall time for what it writes."""

    def monotonic(self) -> float: ...
    def now(self) -> dt.datetime: ...
    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class LeaseTiming:
    duration: float  # leaseDurationSeconds: how long others wait on an unchanged record
    renew_deadline: float  # the holder steps down this long after its last renewal
    retry_period: float  # between renewals, and between a follower's tries (jittered)

    @classmethod
    def of(cls, duration: float, retry_period: float = RETRY_PERIOD_S) -> LeaseTiming:
        """client-go's proportions for a lease of ``duration`` seconds."""
        return cls(duration, duration * RENEW_SHARE, retry_period)

    def __post_init__(self) -> None:
        # client-go's own checks: the holder stops before others may start.
        if not self.duration > self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"lease_duration {self.duration}s is too short: its renew deadline "
                f"{self.renew_deadline:.1f}s must exceed {JITTER_FACTOR} x the retry period "
                f"{self.retry_period}s"
            )


# The record as client-go compares it: any change restarts the other holder's lease.
Record = tuple[str, int, str, str, int]


def _record(spec: JsonObj) -> Record:
    return (
        str(spec.get("holderIdentity") or ""),
        int(spec.get("leaseDurationSeconds") or 0),
        str(spec.get("acquireTime") or ""),
        str(spec.get("renewTime") or ""),
        int(spec.get("leaseTransitions") or 0),
    )


def _micro_time(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    def __init__(
        self,
        api: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming,
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._api = api
        self._ns, self._name = namespace, name
        self._base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._path = f"{self._base}/{name}"
        self.identity = identity
        self.timing = timing
        self._clock = clock or SystemClock()
        self._rand = rand
        self._observed: Record | None = None
        self._observed_at = 0.0  # monotonic: when _observed last changed
        self._lease: JsonObj | None = None  # as last read or written: its resourceVersion
        self._leading = False
        self._renewed_at = 0.0  # monotonic: start of the last successful write as holder

    @property
    def leading(self) -> bool:
        return self._leading

    def _observe(self, record: Record, at: float) -> None:
        if record != self._observed:
            if self._observed is None or record[0] != self._observed[0]:
                log.info("leader lease %s/%s: holder %r", self._ns, self._name, record[0])
            self._observed, self._observed_at = record, at

    def _spec(self, old: Record | None, now: dt.datetime) -> JsonObj:
        stamp = _micro_time(now)
        ours = old is not None and old[0] == self.identity
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(self.timing.duration)),
            "acquireTime": old[2] if ours and old else stamp,
            "renewTime": stamp,
            "leaseTransitions": (old[4] if old else 0) + (0 if ours or old is None else 1),
        }

    async def _write(self, lease: JsonObj, spec: JsonObj, started: float) -> bool:
        body = {**lease, "spec": spec}
        try:
            stored = await self._api.replace(self._path, body)
        except ApiStatusError as exc:
            if exc.conflict:
                return False
            raise
        self._wrote(stored, started)
        return True

    def _wrote(self, stored: JsonObj, started: float) -> None:
        self._lease = stored
        self._observe(_record(stored.get("spec") or {}), started)
        self._leading, self._renewed_at = True, started

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to become (or stay) the holder: True once written as holder.

        Raises :class:`ApiError` when the apiserver does not answer."""
        started, now = self._clock.monotonic(), self._clock.now()
        fast = self._leading and self._lease is not None  # our last write is current
        if fast and await self._write(self._lease or {}, self._spec(self._observed, now), started):
            return True
        try:
            lease = await self._api.get(self._path)
        except ApiStatusError as exc:
            if not exc.not_found:
                raise
            body = {"metadata": {"name": self._name}, "spec": self._spec(None, now)}
            try:
                stored = await self._api.create(self._base, body)
            except ApiStatusError as err:
                if err.conflict:
                    return False
                raise
            self._wrote(stored, started)
            return True
        record = _record(lease.get("spec") or {})
        self._observe(record, started)
        self._lease = lease
        holder = record[0]
        if self._leading and holder != self.identity:
            log.error("leader lease %s/%s lost to %r", self._ns, self._name, holder)
            self._leading = False
            return False
        expires = self._observed_at + record[1]
        if holder and holder != self.identity and started < expires:
            return False  # held, and it changed less than its duration ago on OUR clock
        return await self._write(lease, self._spec(record, now), started)

    async def acquire(self) -> None:
        """Wait until this replica holds the lease."""
        logged = False
        while True:
            try:
                if await self.try_acquire_or_renew():
                    log.info(
                        "leader lease %s/%s acquired by %s", self._ns, self._name, self.identity
                    )
                    return
            except ApiError as exc:
                log.warning("leader election: %s", exc)
            if not logged:
                log.info("waiting for leader lease %s/%s", self._ns, self._name)
                logged = True
            period = self.timing.retry_period
            await self._clock.sleep(jittered(period, JITTER_FACTOR, self._rand))

    async def keep(self) -> None:
        """Renew every retry period until the lease is lost, or not renewed
        within the renew deadline; returns then, no longer leading."""
        while self._leading:
            await self._clock.sleep(self.timing.retry_period)
            await self._renew()
        log.error("leader lease %s/%s: no longer the leader", self._ns, self._name)

    async def _renew(self) -> None:
        deadline = self._renewed_at + self.timing.renew_deadline
        while self._leading:
            left = deadline - self._clock.monotonic()
            if left <= 0:
                log.error("leader lease not renewed within %.1fs; stepping down",
                          self.timing.renew_deadline)  # fmt: skip
                self._leading = False
                return
            try:
                async with asyncio.timeout(left):  # a hanging request must not outlive it
                    if await self.try_acquire_or_renew():
                        return
            except (ApiError, TimeoutError) as exc:
                log.warning("renewing the leader lease failed: %s", str(exc) or "no answer in time")
            if self._leading:
                await self._clock.sleep(min(self.timing.retry_period, left))

    async def release(self) -> bool:
        """Give the lease up at once (client-go's ReleaseOnCancel) if we hold it:
        holder cleared, ``leaseDurationSeconds`` 1. Call it only after this
        replica stopped acting as leader. False if not held or not released."""
        lease, was_leading = self._lease, self._leading
        self._leading = False
        if not was_leading or lease is None or self._observed is None:
            return False
        stamp = _micro_time(self._clock.now())
        spec: dict[str, Any] = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": self._observed[4],
        }
        try:
            async with asyncio.timeout(self.timing.renew_deadline):
                released = await self._replace_if_ours(lease, spec)
        except (ApiError, TimeoutError) as exc:
            log.warning("releasing the leader lease failed (it expires on its own): %s", exc)
            return False
        if released:
            log.info("leader lease %s/%s released by %s", self._ns, self._name, self.identity)
        return released

    async def _replace_if_ours(self, lease: JsonObj, spec: JsonObj) -> bool:
        try:
            self._lease = await self._api.replace(self._path, {**lease, "spec": spec})
            return True
        except ApiStatusError as exc:
            if not exc.conflict:
                raise
        # A renewal cut short by the stop may have landed after all: read it again.
        lease = await self._api.get(self._path)
        if _record(lease.get("spec") or {})[0] != self.identity:
            return False  # another holder's now: not ours to release
        self._lease = await self._api.replace(self._path, {**lease, "spec": spec})
        return True
