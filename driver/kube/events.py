"""Kubernetes Events, recorded the way client-go's recorders do.

Why: operators look for "why is my claim not ready?" in ``kubectl describe``
and ``kubectl get events``, not in plugin logs. The recorder writes
``events.k8s.io/v1`` Events (``reportingController``, ``reportingInstance``,
``action``, ``reason``, ``regarding``, ``note``, ``type``); the same storage
serves them through ``/api/v1`` too (``involvedObject``, ``reason``).

What it copies from client-go (``tools/events`` and ``tools/record``):

- the Event's name ``<regarding name>.<unix nanoseconds in hex>``, its
  namespace the regarding object's (``default`` for cluster-scoped ones);
- repeats of an event become one Event with a ``series`` (``count``,
  ``lastObservedTime``) patched in place, and a series ends after
  ``finish_s`` (6 min) without a repeat; a new occurrence after that starts
  a new Event. Unlike ``tools/events``, the note is part of what makes two
  events the same (as in ``tools/record``'s correlator): a different
  failure message is a new Event, not a repeat of the first;
- the spam filter of ``tools/record``: a token bucket per regarding object
  and type (``burst`` 25, one token every ``refill_s`` = 300 s), here spent
  per write rather than per occurrence (repeats waiting in the queue are one
  write). A new Event over the rate is dropped; a repeat over the rate is
  still counted and its count written with the next write of its series
  (at the latest when the series ends);
- recording never blocks or fails the caller: :meth:`EventRecorder.event`
  puts the event on a bounded queue (dropped when full) and returns; the
  :meth:`EventRecorder.run` task writes them; an API error is logged and
  retried a few times (a refusal by the apiserver is not), never raised.

Concurrency: :meth:`run` is a task on the process's asyncio loop; ``event``
may be called from any thread (it hops onto the loop once ``run`` started).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.backoff import Backoff
from driver.errors import ApiError, ApiStatusError
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)

EVENTS_V1 = "/apis/events.k8s.io/v1"
NORMAL, WARNING = "Normal", "Warning"
SPAM_BURST = 25  # client-go tools/record defaultSpamBurst
SPAM_REFILL_S = 300.0  # one token every 5 minutes (defaultSpamQPS = 1/300)
SERIES_FINISH_S = 360.0  # client-go tools/events finishTime (6 minutes)
MAX_QUEUED = 1000  # client-go tools/events maxQueuedEvents
MAX_CACHED = 4096  # client-go tools/record maxLruCacheEntries
PRUNE_EVERY_S = 60.0  # how often refilled spam-filter buckets are forgotten
NOTE_LIMIT = 1024  # apiserver validation: note/message at most 1024 bytes
FIELD_LIMIT = 128  # reportingInstance, action and reason
WRITE_TRIES = 3


def micro_time(t: float) -> str:
    """A ``metav1.MicroTime``: RFC 3339 with microseconds, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about (a ``corev1.ObjectReference``)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def of(cls, obj: Mapping[str, Any], kind: str, api_version: str = "v1") -> ObjectRef:
        """The reference of an API object (list items carry no kind: pass it)."""
        meta = obj.get("metadata") or {}
        return cls(
            kind=str(obj.get("kind") or kind),
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            api_version=str(obj.get("apiVersion") or api_version),
        )

    def to_json(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


def _limit(text: str, limit: int) -> str:
    raw = text.encode()
    return text if len(raw) <= limit else raw[:limit].decode(errors="ignore")


@dataclass(frozen=True)
class _Key:
    type: str
    reason: str
    action: str
    note: str
    regarding: ObjectRef
    related: ObjectRef | None


@dataclass
class _Series:
    """One Event as stored (or about to be), with its repeats."""

    key: _Key
    first: float
    last: float
    count: int = 1
    name: str | None = None  # set once created
    namespace: str = ""
    written: int = 0  # the count the stored Event carries


@dataclass
class _Bucket:
    tokens: float
    stamp: float

    def level(self, now: float, refill_s: float, burst: int) -> float:
        """The tokens it holds at ``now``: refilled one per ``refill_s``, at most ``burst``."""
        return min(burst, self.tokens + (now - self.stamp) / refill_s)


@dataclass
class _Stats:
    """What the recorder did, for tests and logs."""

    written: int = 0
    dropped: int = 0
    failed: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


class EventRecorder:
    """Records Events of one source (``controller``/``instance``)."""

    def __init__(
        self,
        api: KubeClient,
        controller: str,
        instance: str,
        *,
        burst: int = SPAM_BURST,
        refill_s: float = SPAM_REFILL_S,
        finish_s: float = SERIES_FINISH_S,
        max_queued: int = MAX_QUEUED,
        clock: Callable[[], float] = time.time,
        retry_s: float = 1.0,
    ) -> None:
        self._api = api
        self.controller = controller
        self.instance = _limit(instance, FIELD_LIMIT)
        self._burst, self._refill, self._finish = burst, refill_s, finish_s
        self._clock = clock
        self._retry_s = retry_s
        self._queue: asyncio.Queue[tuple[_Key, float]] = asyncio.Queue(max_queued)
        self._series: dict[_Key, _Series] = {}
        self._buckets: dict[tuple[ObjectRef, str], _Bucket] = {}
        self._pruned_at = clock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = _Stats()

    # -- callers ------------------------------------------------------------

    def event(
        self,
        regarding: ObjectRef,
        type_: str,
        reason: str,
        action: str,
        note: str,
        related: ObjectRef | None = None,
    ) -> None:
        """Record an event; returns at once and never raises."""
        try:
            key = _Key(type_, _limit(reason, FIELD_LIMIT), _limit(action, FIELD_LIMIT),
                       _limit(note, NOTE_LIMIT), regarding, related)  # fmt: skip
            item = (key, self._clock())
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if self._loop is not None and running is not self._loop:
                self._loop.call_soon_threadsafe(self._put, item)
            else:
                self._put(item)
        except Exception:  # recording must never fail the caller
            log.exception("event %s on %s %s not recorded", reason, regarding.kind, regarding.name)

    def normal(self, regarding: ObjectRef, reason: str, action: str, note: str) -> None:
        self.event(regarding, NORMAL, reason, action, note)

    def warning(self, regarding: ObjectRef, reason: str, action: str, note: str) -> None:
        self.event(regarding, WARNING, reason, action, note)

    def _put(self, item: tuple[_Key, float]) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.stats.dropped += 1
            log.warning("event queue full: dropping %s on %s", item[0].reason, item[0].regarding)

    async def drain(self) -> None:
        """Wait until every event recorded so far has been handled (tests)."""
        await self._queue.join()

    # -- the writer task ------------------------------------------------------

    async def run(self) -> None:
        """Write queued events until cancelled."""
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout(self._finish / 2):  # not wait_for: docs/design.md
                    first = await self._queue.get()
            except TimeoutError:
                await self._finish_series()
                continue
            batch = [first]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                due = {key: self._observe(key, at) for key, at in batch}  # repeats: one write
                for key, series in due.items():
                    if self._allowed(key, self._clock()):
                        await self._write(series)
                    elif series.name is None:  # a new Event over the rate: dropped
                        self._series.pop(key, None)
                        self.stats.dropped += 1
                        log.debug("event %s on %s over the rate: dropped", key.reason,
                                  key.regarding)  # fmt: skip
                await self._finish_series()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not take the process down
                log.exception("writing events failed")
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _allowed(self, key: _Key, now: float) -> bool:
        """The spam filter: one token bucket per regarding object and type."""
        bucket = self._buckets.get((key.regarding, key.type))
        if bucket is None:
            if len(self._buckets) >= MAX_CACHED:
                self._buckets.pop(next(iter(self._buckets)))
            bucket = self._buckets[(key.regarding, key.type)] = _Bucket(self._burst, now)
        bucket.tokens = bucket.level(now, self._refill, self._burst)
        bucket.stamp = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _observe(self, key: _Key, at: float) -> _Series:
        """Count one occurrence; its series (new, or one not ended yet)."""
        series = self._series.get(key)
        if series is not None and at - series.last > self._finish:
            del self._series[key]  # ended: a new occurrence is a new Event
            series = None
        if series is None:
            if len(self._series) >= MAX_CACHED:
                self._series.pop(next(iter(self._series)))
            series = self._series[key] = _Series(key, first=at, last=at)
            return series
        series.count += 1
        series.last = at
        return series

    def _prune_buckets(self, now: float) -> None:
        """Forget the buckets that have refilled: a full bucket is what a new
        one would be, so a long-running controller keeps only the objects it
        recorded on lately (the LRU bound alone kept 4096 forever)."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        burst, refill = self._burst, self._refill
        full = [k for k, b in self._buckets.items() if b.level(now, refill, burst) >= burst]
        for k in full:
            del self._buckets[k]

    async def _finish_series(self) -> None:
        """End series without a repeat for ``finish_s``, writing unwritten counts;
        forget refilled buckets now and then."""
        now = self._clock()
        self._prune_buckets(now)
        for key, series in list(self._series.items()):
            if now - series.last <= self._finish:
                continue
            if series.count != series.written:
                await self._write(series)
            self._series.pop(key, None)

    def _body(self, series: _Series) -> dict[str, Any]:
        key = series.key
        ref = key.regarding
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": series.name, "namespace": series.namespace},
            "eventTime": micro_time(series.first),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": key.action,
            "reason": key.reason,
            "regarding": ref.to_json(),
            "note": key.note,
            "type": key.type,
        }
        if key.related is not None:
            body["related"] = key.related.to_json()
        if series.count > 1:
            body["series"] = {"count": series.count, "lastObservedTime": micro_time(series.last)}
        return body

    async def _write(self, series: _Series) -> None:
        key = series.key
        backoff = Backoff(self._retry_s)
        for attempt in range(1, WRITE_TRIES + 1):
            count = series.count
            try:
                await self._send(series)
                series.written = count
                self.stats.written += 1
                self.stats.by_reason[key.reason] = self.stats.by_reason.get(key.reason, 0) + 1
                log.debug("event %s %s on %s %s (count %d): %s", key.type, key.reason,
                          key.regarding.kind, key.regarding.name, count, key.note)  # fmt: skip
                return
            except ApiStatusError as exc:
                if exc.conflict and series.written == 0:
                    return  # created already (AlreadyExists): nothing to add
                if (exc.status >= 500 or exc.status == 429) and attempt < WRITE_TRIES:
                    await backoff.sleep()
                    continue
                self.stats.failed += 1
                log.warning("event %s on %s %s refused: %s", key.reason, key.regarding.kind,
                            key.regarding.name, exc)  # fmt: skip
                return
            except ApiError as exc:
                if attempt == WRITE_TRIES:
                    self.stats.failed += 1
                    log.warning("event %s on %s %s not written after %d tries: %s", key.reason,
                                key.regarding.kind, key.regarding.name, attempt, exc)  # fmt: skip
                    return
                await backoff.sleep()

    async def _send(self, series: _Series) -> None:
        if series.name is not None and series.count > 1:
            path = f"{EVENTS_V1}/namespaces/{series.namespace}/events/{series.name}"
            patch = {"series": {"count": series.count,
                                "lastObservedTime": micro_time(series.last)}}  # fmt: skip
            try:
                await self._api.merge_patch(path, patch)
                return
            except ApiStatusError as exc:
                if not exc.not_found:
                    raise
                # Gone (the apiserver's event TTL): create it again, as client-go does.
        ref = series.key.regarding
        if series.name is None:
            series.namespace = ref.namespace or "default"
            series.name = f"{ref.name[:236]}.{time.time_ns():x}"
        await self._api.create(f"{EVENTS_V1}/namespaces/{series.namespace}/events",
                               self._body(series))  # fmt: skip


class ObjectEvents:
    """A recorder bound to one object (the plugin's Node): what the plugin's
    parts that report about their node get."""

    def __init__(self, recorder: EventRecorder, regarding: ObjectRef) -> None:
        self.recorder = recorder
        self.regarding = regarding

    def normal(self, reason: str, action: str, note: str) -> None:
        self.recorder.event(self.regarding, NORMAL, reason, action, note)

    def warning(self, reason: str, action: str, note: str) -> None:
        self.recorder.event(self.regarding, WARNING, reason, action, note)
