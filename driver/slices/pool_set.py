"""Keep a changing set of pools' ResourceSlices equal to what we want: one watch for all.

Why a module: the per-domain fabric pool (``driver.controller.pool.domain_pool``)
is a pool per reach domain, and domains come and go with the fabric. Each
pool is written by its own :class:`~driver.slices.publisher.SlicePublisher`
(its generation, diff and back-off), over one shared list+watch of every
slice of the family; a pool that is no longer wanted has its slices
deleted, so nothing is left behind when a domain goes.

Nothing is withdrawn, or written, before the owner's first
:meth:`PoolSetPublisher.set_pools`: until then it has said nothing about
which pools it wants (a controller that just took over lists the stored
slices long before its first full pass), and a stored pool is not known to
be unwanted. A new leader that withdrew the fabric pool then would pull
allocated devices from under their claims and lose what a previous
incarnation had attached.

Concurrency: tasks on the process's asyncio loop, in :meth:`PoolSetPublisher.run`'s
TaskGroup: the shared watch, a writer per pool, and the loop that starts
writers, withdraws pools and tracks ``in_sync``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from driver.backoff import Backoff
from driver.errors import ApiError, ApiStatusError
from driver.kube.api import slice_path
from driver.kube.cache import ObjectCache
from driver.kube.client import KubeClient
from driver.metrics import SLICE_WRITES
from driver.slices.build import PoolSpec
from driver.slices.publisher import (
    BACKOFF_JITTER,
    BACKOFF_MAX,
    BACKOFF_START,
    SlicePublisher,
)

log = logging.getLogger(__name__)


def pool_of(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name") or "")


class PoolSetPublisher:
    """Publishes the pools ``family`` admits, as :meth:`set_pools` last said."""

    def __init__(
        self,
        api: KubeClient,
        query: Mapping[str, str],
        family: Callable[[str], bool],
        field_manager: str = "patchbay",
    ) -> None:
        self._api = api
        self._field_manager = field_manager
        self._changed = asyncio.Event()
        self._stored = ObjectCache(
            api, slice_path(), self._wake, query,
            accept=lambda o: family(pool_of(o)), on_listed=self._listed,
        )  # fmt: skip
        self._writers: dict[str, SlicePublisher] = {}
        self._wanted: dict[str, PoolSpec] = {}
        # Set by the first set_pools: only then is a stored pool known to be unwanted.
        self._declared = asyncio.Event()
        self.synced = self._stored.synced
        self.in_sync = asyncio.Event()
        self.on_listed: Callable[[], None] | None = None

    def set_pools(self, pools: Sequence[PoolSpec]) -> None:
        """Declare every pool of the family; those not named are withdrawn.
        Call it with the whole view (the first call ends the wait in :meth:`run`)."""
        wanted = {p.pool_name: p for p in pools}
        if wanted == self._wanted and self._declared.is_set():
            return
        self._declared.set()
        self._wanted = wanted
        for name, spec in wanted.items():
            if name in self._writers:
                self._writers[name].set_pool(spec)
        self.in_sync.clear()
        self._changed.set()

    def renew(self, pool: str | None) -> bool:
        """Write ``pool`` (None: the first wanted one) once more as it is
        (``SlicePublisher.renew``); False when it is not wanted or not
        written yet."""
        name = pool if pool is not None else min(self._wanted, default="")
        writer = self._writers.get(name) if name in self._wanted else None
        if writer is None:
            return False
        writer.renew()
        return True

    def stored(self) -> dict[str, dict[str, Any]]:
        return dict(self._stored.objects)

    def _wake(self) -> None:
        for w in self._writers.values():
            w.wake()
        self._changed.set()

    def _listed(self) -> None:
        if self.on_listed is not None:
            self.on_listed()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._stored.run(), name="pool-set-watch")
            await self.synced.wait()
            await self._declared.wait()  # nothing is known unwanted before
            backoff = Backoff(BACKOFF_START, BACKOFF_MAX, BACKOFF_JITTER)
            track: asyncio.Task[None] | None = None
            while True:
                await self._changed.wait()
                self._changed.clear()
                for name, spec in self._wanted.items():
                    if name not in self._writers:
                        w = SlicePublisher(self._api, {}, name, self._field_manager,
                                           cache=self._stored)  # fmt: skip
                        w.set_pool(spec)
                        self._writers[name] = w
                        group.create_task(w.run(), name=f"pool-set-{name}")
                if await self._withdraw():
                    backoff.reset()
                else:
                    await backoff.sleep()
                    self._changed.set()
                if track is not None:
                    track.cancel()
                track = group.create_task(self._track(), name="pool-set-in-sync")

    async def _withdraw(self) -> bool:
        """Delete the stored slices of pools no longer wanted (their writer stays
        idle: a pool that comes back is declared to it again); False when a
        delete failed (tried again after a back-off)."""
        done = True
        for name, obj in sorted(self._stored.objects.items()):
            pool = pool_of(obj)
            if pool in self._wanted:
                continue
            if pool in self._writers:
                self._writers[pool].set_pool_gone()
            try:
                await self._api.delete(slice_path(name))
                SLICE_WRITES.labels(op="delete").inc()
                log.info("pool %s withdrawn: slice %s deleted", pool, name)
            except ApiStatusError as exc:
                if not exc.not_found:
                    log.warning("withdrawing slice %s failed: %s", name, exc)
                    done = False
                    continue
            except (ApiError, OSError) as exc:
                log.warning("withdrawing slice %s failed: %s", name, exc)
                done = False
                continue
            self._stored.objects.pop(name, None)
        return done

    async def _track(self) -> None:
        """Set ``in_sync`` once every wanted pool is stored and no other is left."""
        wanted = self._wanted
        for name in wanted:
            writer = self._writers.get(name)
            if writer is None:
                return  # declared since: the next round of the loop starts it, and tracks again
            await writer.in_sync.wait()
        leftover = any(pool_of(o) not in wanted for o in self._stored.objects.values())
        if wanted is self._wanted and not self._changed.is_set() and not leftover:
            self.in_sync.set()
