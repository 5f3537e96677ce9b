"""A list+watch cache of one kind of API object.

Why: the controller reacts to ResourceClaims and Nodes as they change and
must never poll the apiserver. Concurrency: :meth:`ObjectCache.run` is one
asyncio task that lists, then watches from the list's resourceVersion,
re-listing after an expired or broken watch (backing off exponentially);
``on_change`` is called on the loop after every change so the owner can mark
itself dirty.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from driver.errors import ApiError
from driver.kube.api import KubeApi

log = logging.getLogger(__name__)


class ObjectCache:
    """Objects of one list path, keyed by ``namespace/name`` (or name)."""

    def __init__(
        self,
        api: KubeApi,
        path: str,
        on_change: Callable[[], None],
        query: Mapping[str, str] | None = None,
    ) -> None:
        self._api = api
        self._path = path
        self._query = dict(query or {})
        self._on_change = on_change
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace")
        return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                listing = await self._api.get(self._path, self._query)
                self.objects = {self.key(o): o for o in listing.get("items") or ()}
                self.synced.set()
                self._on_change()
                rv = listing["metadata"]["resourceVersion"]
                delay = 0.2
                while True:
                    rv = await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError, ValueError, KeyError) as exc:
                log.warning("watch of %s failed, re-listing in %.1fs: %s", self._path, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _watch(self, rv: str) -> str:
        async for event in self._api.watch(self._path, {**self._query, "resourceVersion": rv}):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(f"watch error: {obj.get('message', obj)}")
            rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.objects.pop(self.key(obj), None)
            else:
                self.objects[self.key(obj)] = obj
            self._on_change()
        return rv
