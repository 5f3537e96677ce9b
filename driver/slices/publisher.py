"""Keep one pool's ResourceSlices in the apiserver equal to what we want.

Concurrency: runs as two tasks on the process's asyncio loop. A watch task
lists and then watches our slices into a cache (``driver.kube.cache``); a
reconcile task compares the
cache with the desired pool whenever either side changes and writes only the
difference. Nothing runs on a timer: an idle node makes no writes, and a
slice that someone edits or deletes (the kubelet wipes a node's slices when
it starts) comes back within one watch event. API errors back off
exponentially.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from driver.backoff import Backoff, jittered
from driver.errors import ApiError, ApiStatusError
from driver.kube.api import slice_path
from driver.kube.cache import ObjectCache
from driver.kube.client import KubeClient
from driver.kube.events import ObjectEvents
from driver.metrics import SLICE_FAILURES, SLICE_WRITES
from driver.slices.build import DesiredSlice, PoolSpec, build_slices, left_out, slice_object
from driver.slices.diff import diff_pool, renewal

log = logging.getLogger(__name__)

BACKOFF_START = 0.2
BACKOFF_MAX = 30.0
REWRITES_BEFORE_BACKOFF = 3
BACKOFF_STUCK_MAX = 300.0
# Each wait is up to half longer at random (client-go's wait.Jitter): after an
# apiserver outage every node's plugin retries, and not all in one instant.
BACKOFF_JITTER = 0.5
DEVICES_LEFT_OUT = "DevicesNotPublished"  # Event reasons (docs/events.md)
SLICE_REFUSED = "SlicePublishFailed"


class SlicePublisher:
    """Publishes one pool and restores it when it drifts."""

    def __init__(
        self,
        api: KubeClient,
        query: Mapping[str, str],
        pool_name: str,
        field_manager: str = "patchbay",
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        cache: ObjectCache | None = None,
    ) -> None:
        self._api = api
        # The back-offs' waits and their jitter in [0, 1) (a test injects its own).
        self._sleep = sleep
        self._rand = rand
        self._query = dict(query)
        self._pool_name = pool_name
        self._field_manager = field_manager
        self._dirty = asyncio.Event()
        # The stored slices of our pool (list+watch), plus what we wrote; or a
        # cache of several pools' slices that its owner runs and shares
        # (``driver.slices.pool_set``), which calls :meth:`wake` on a change.
        self._shared = cache is not None
        self._stored = cache if cache is not None else self._own_cache(api, query)
        self._desired: PoolSpec | None = None
        self._built: tuple[PoolSpec, list[DesiredSlice]] | None = None
        self._generation = 0
        # Consecutive rewrites of one unchanged desired pool: the apiserver does
        # not keep what we write (a field dropped by a disabled feature gate,
        # someone fighting us). We back off instead of writing in a hot loop.
        self._rewrites = 0
        self._last_written: PoolSpec | None = None
        self._renew = False  # write the pool again as it is (:meth:`renew`)
        self.synced = self._stored.synced  # set once the first listing is in the cache
        self.in_sync = asyncio.Event()
        # Called on the loop after every (re)listing, the first one included:
        # an owner that waits for ``synced`` learns of it without polling.
        self.on_listed: Callable[[], None] | None = None
        # Where a device left out or a slice the apiserver refused is an
        # Event (the plugin's Node); None: logged only.
        self.events: ObjectEvents | None = None

    def _own_cache(self, api: KubeClient, query: Mapping[str, str]) -> ObjectCache:
        return ObjectCache(
            api, slice_path(), self._dirty.set, query, accept=self._ours, on_listed=self._listed
        )

    def set_pool(self, pool: PoolSpec) -> None:
        """Declare what the pool should hold; the reconcile task does the rest.
        The same pool again changes nothing (no rebuild, no diff)."""
        if pool == self._desired:
            return
        self._desired = pool
        self.in_sync.clear()
        self._dirty.set()

    def set_pool_gone(self) -> None:
        """Stop writing the pool (its owner deletes its slices: ``driver.slices.pool_set``)."""
        self._desired = None
        self.in_sync.clear()

    def wake(self) -> None:
        """Compare again (a shared cache changed)."""
        self._dirty.set()

    def renew(self) -> None:
        """Write the pool once more as it is, at a new generation (an Update of
        each slice): an event for the scheduler where nothing in the pool
        changed (``driver.controller.requeue``). Nothing without a pool."""
        if self._desired is not None:
            self._renew = True
            self._dirty.set()

    @property
    def _cache(self) -> dict[str, dict[str, Any]]:
        if not self._shared:
            return self._stored.objects
        return {n: o for n, o in self._stored.objects.items() if self._ours(o)}

    def stored(self) -> dict[str, dict[str, Any]]:
        return dict(self._cache)

    async def run(self) -> None:
        """Run watch and reconcile until cancelled."""
        if self._shared:
            await self._reconcile_loop()
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(self._stored.run(), name=f"slices-watch-{self._pool_name}")
            group.create_task(self._reconcile_loop(), name=f"slices-reconcile-{self._pool_name}")

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        return bool((obj.get("spec") or {}).get("pool", {}).get("name") == self._pool_name)

    def _listed(self) -> None:
        if self.on_listed is not None:
            self.on_listed()

    async def _reconcile_loop(self) -> None:
        await self.synced.wait()
        backoff = Backoff(BACKOFF_START, BACKOFF_MAX, BACKOFF_JITTER, self._rand)
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self._desired is None:
                continue
            try:
                await self._reconcile(self._desired)
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError) as exc:
                if isinstance(exc, ApiStatusError) and 400 <= exc.status < 500 and not exc.conflict:
                    self._warn(SLICE_REFUSED, f"pool {self._pool_name}: {exc}")
                SLICE_FAILURES.labels(reason="api").inc()
                delay = backoff.next()
                log.warning(
                    "publishing pool %s failed, retrying in %.1fs: %s",
                    self._pool_name, delay, exc,
                )  # fmt: skip
                await self._sleep(delay)
                self._dirty.set()

    async def _reconcile(self, pool: PoolSpec) -> None:
        if self._built is None or self._built[0] is not pool:
            self._built = (pool, build_slices(pool))  # once per pool, not per watch event
            self._report_left_out(pool)
        desired = self._built[1]
        diff = diff_pool(desired, self._cache, pool.owner, self._generation)
        renewing, self._renew = self._renew and diff.in_sync, False
        if renewing:
            log.info("pool %s: renewed for the scheduler (nothing in it changed)", pool.pool_name)
            diff = renewal(diff, desired, self._generation)
        if diff.in_sync:
            self.in_sync.set()
            return
        if not renewing:  # a renewal is asked for, not a drift
            self._rewrites = self._rewrites + 1 if pool is self._last_written else 0
        self._last_written = pool
        if self._rewrites >= REWRITES_BEFORE_BACKOFF:
            SLICE_FAILURES.labels(reason="diverged").inc()
            delay = jittered(
                min(2.0**self._rewrites, BACKOFF_STUCK_MAX), BACKOFF_JITTER, self._rand
            )
            log.error(
                "pool %s: the stored slices differ again after %d rewrites of the same pool"
                " (a field the apiserver drops? DRA feature gates?); next write in %.0fs",
                pool.pool_name, self._rewrites, delay,
            )  # fmt: skip
            await self._sleep(delay)
        log.info(
            "pool %s: writing generation %d (%d create, %d update, %d delete)",
            pool.pool_name,
            diff.generation,
            len(diff.to_create),
            len(diff.to_update),
            len(diff.to_delete),
        )
        count = len(desired)
        self._generation = diff.generation
        for want in desired:
            body = slice_object(pool, want, diff.generation, count)
            if want.name in diff.to_update:
                body["metadata"]["resourceVersion"] = self._cache[want.name]["metadata"][
                    "resourceVersion"
                ]
                stored = await self._api.replace(slice_path(want.name), body)
                SLICE_WRITES.labels(op="update").inc()
            else:
                try:
                    stored = await self._api.create(slice_path(), body)
                except ApiStatusError as exc:
                    if not exc.conflict:
                        raise
                    # Created meanwhile (e.g. by a previous incarnation): the
                    # watch brings it into the cache and we reconcile again.
                    log.info("slice %s already exists; will reconcile from the watch", want.name)
                    self._dirty.set()
                    continue
                SLICE_WRITES.labels(op="create").inc()
            self._stored.objects[want.name] = stored
        for name in diff.to_delete:
            try:
                await self._api.delete(slice_path(name))
            except ApiStatusError as exc:
                if not exc.not_found:
                    raise
            SLICE_WRITES.labels(op="delete").inc()
            self._stored.objects.pop(name, None)
        if not self._dirty.is_set():
            self.in_sync.set()

    def _warn(self, reason: str, note: str) -> None:
        if self.events is not None:
            self.events.warning(reason, "PublishSlices", note)

    def _report_left_out(self, pool: PoolSpec) -> None:
        bad = left_out(pool.devices)
        if bad:
            names = "; ".join(f"{pool.devices[i].name}: {why}" for i, why in bad.items())
            self._warn(DEVICES_LEFT_OUT, f"{len(bad)} device(s) left out of pool "
                       f"{pool.pool_name} (limits the apiserver enforces): {names}")  # fmt: skip
