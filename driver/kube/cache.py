"""A list+watch cache of one kind of API object: the one list+watch loop.

Why: the controller reacts to ResourceClaims and Nodes as they change, and
the slice publisher keeps its pool's stored slices, and none of them may
poll the apiserver. Concurrency: :meth:`ObjectCache.run` is one asyncio task
that lists, then watches from the list's resourceVersion, re-listing after
an expired or broken watch (backing off exponentially, to ``RELIST_CAP_S``,
each wait stretched at random by up to ``RELIST_JITTER`` so the nodes of a
cluster do not re-list in lockstep when an outage ends: a watch is back
within 5 s of an outage's end); ``on_change`` is
called on the loop after every listing and every change so the owner can
mark itself dirty, ``on_listed`` after every (re)listing, ``on_event`` with
each watch event's type and object (a state a later one may replace before
the owner looks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from driver.backoff import Backoff
from driver.errors import ApiError
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)

RELIST_CAP_S = 4.0
RELIST_JITTER = 0.25  # a wait is 1 to 1.25 times its base: at most 5 s


class ObjectCache:
    """Objects of one list path, keyed by ``namespace/name`` (or name).

    ``accept`` keeps only the objects it returns True for (e.g. the slices of
    one pool); the owner may also put what it wrote into ``objects`` itself.
    """

    def __init__(
        self,
        api: KubeClient,
        path: str,
        on_change: Callable[[], None],
        query: Mapping[str, str] | None = None,
        *,
        accept: Callable[[Mapping[str, Any]], bool] | None = None,
        on_listed: Callable[[], None] | None = None,
        on_event: Callable[[str, Mapping[str, Any]], None] | None = None,
    ) -> None:
        self._api = api
        self._path = path
        self._query = dict(query or {})
        self._on_change = on_change
        self._accept = accept or (lambda _obj: True)
        self._on_listed = on_listed
        self._on_event = on_event
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace")
        return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))

    async def run(self) -> None:
        # Capped at RELIST_CAP_S (plus jitter): after an apiserver outage each
        # watch is back within that (one LIST per watch per cap during it: no hot loop).
        backoff, failures = Backoff(cap=RELIST_CAP_S, jitter=RELIST_JITTER), 0
        while True:
            try:
                listing = await self._api.get(self._path, self._query)
                if failures:  # the mark of an outage's end (tests measure convergence by it)
                    log.info("%s listed again after %d failed tries", self._path, failures)
                    failures = 0
                self.objects = {
                    self.key(o): o for o in listing.get("items") or () if self._accept(o)
                }
                self.synced.set()
                self._on_change()
                if self._on_listed is not None:
                    self._on_listed()
                rv = listing["metadata"]["resourceVersion"]
                backoff.reset()
                while True:
                    rv = await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError, ValueError, KeyError) as exc:
                failures += 1
                delay = backoff.next()
                log.warning("watch of %s failed, re-listing in %.1fs: %s", self._path, delay, exc)
                await asyncio.sleep(delay)

    async def _watch(self, rv: str) -> str:
        async for event in self._api.watch(self._path, {**self._query, "resourceVersion": rv}):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(f"watch error: {obj.get('message', obj)}")
            rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
            if kind == "BOOKMARK" or not self._accept(obj):
                continue
            if kind == "DELETED":
                self.objects.pop(self.key(obj), None)
            else:
                self.objects[self.key(obj)] = obj
            if self._on_event is not None:
                self._on_event(str(kind), obj)
            self._on_change()
        return rv
