"""An in-memory Kubernetes API: the :class:`~driver.kube.client.KubeClient`
double that ships with patchbay, as the NVML fake does.

It keeps objects by REST path with one resourceVersion counter, answers
gets and lists (``fieldSelector`` and ``labelSelector`` equality terms),
streams watch events from a resourceVersion, refuses a create of an
existing name and a write with a stale resourceVersion (409), a read or
write of a missing object (404), applies JSON merge patches and (roughly,
:func:`apply_merge`) server-side applies; the
``status`` subresource writes only ``status``, the main resource keeps it;
a pod's ``eviction`` deletes it (its uid precondition checked).
What the real apiserver does beyond that (validation, defaulting,
admission, garbage collection) it does not. Test hooks: :meth:`add` seeds
an object as given, :meth:`pause` holds
a list until released, :meth:`fail` injects an HTTP status,
:attr:`on_store` rewrites what is stored (an apiserver dropping a field),
:meth:`end_watches` ends the open watches (as the server's timeout does),
and every request is logged in :attr:`requests`.

Concurrency: one asyncio loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.errors import ApiStatusError

JsonObj = dict[str, Any]


@dataclass(frozen=True)
class _Ref:
    prefix: str  # "/api/v1" or "/apis/<group>/<version>"
    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_path(path: str) -> _Ref:
    parts = path.strip("/").split("/")
    n = 2 if parts[0] == "api" else 3
    prefix, rest = "/" + "/".join(parts[:n]), parts[n:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ValueError(f"not a resource path: {path}")
    return _Ref(prefix, rest[0], namespace, rest[1] if len(rest) > 1 else None,
                rest[2] if len(rest) > 2 else None)  # fmt: skip


def _field(obj: Mapping[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def _selected(obj: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    for term in filter(None, str(query.get("fieldSelector") or "").split(",")):
        key, negate, want = _term(term)
        if (_field(obj, key) == want) == negate:
            return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, str(query.get("labelSelector") or "").split(",")):
        key, negate, want = _term(term)
        if (labels.get(key) == want) == negate:
            return False
    return True


def _term(term: str) -> tuple[str, bool, str]:
    if "!=" in term:
        key, want = term.split("!=", 1)
        return key, True, want
    key, want = term.replace("==", "=").split("=", 1)
    return key, False, want


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


# Keys of the list-maps an apply merges by (the rest of a list is replaced).
_LIST_KEYS = (("type",), ("driver", "pool", "device", "shareID"))


def apply_merge(target: Any, patch: Any) -> Any:
    """A server-side apply of one manager, as far as this double goes: objects
    merge, lists of objects keyed as a list-map (conditions by ``type``,
    device status by driver/pool/device/shareID) merge entry by entry, other
    lists replace. Field ownership, and so what a later apply removes, is
    not modelled."""
    if isinstance(patch, Mapping):
        out = dict(target) if isinstance(target, Mapping) else {}
        for key, value in patch.items():
            out[key] = apply_merge(out.get(key), value)
        return out
    if isinstance(patch, list) and isinstance(target, list):
        keyed = [k for k in _LIST_KEYS if all(isinstance(e, Mapping) and k[0] in e for e in patch)]
        keys = keyed[0] if patch and keyed else None
        if keys is not None:
            out_list = [copy.deepcopy(e) for e in target]
            for entry in patch:
                at = [i for i, e in enumerate(out_list)
                      if all(e.get(k) == entry.get(k) for k in keys)]  # fmt: skip
                if at:
                    out_list[at[0]] = apply_merge(out_list[at[0]], entry)
                else:
                    out_list.append(copy.deepcopy(entry))
            return out_list
    return copy.deepcopy(patch)


class MemoryKube:
    """The in-memory API (see the module docstring)."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str | None, str], JsonObj] = {}
        self._rv = itertools.count(1)
        self._last = 0
        self._log: list[tuple[int, str, tuple[str, str, str | None, str], JsonObj]] = []
        self._waiters: set[asyncio.Event] = set()
        self._paused: dict[str, asyncio.Event] = {}
        self._failures: list[list[Any]] = []  # [method, path, status, times]
        self._generation = 0  # bumped by end_watches
        self._writes = 0
        self.on_store: Callable[[str, JsonObj], None] | None = None
        self.requests: list[tuple[str, str]] = []

    # -- test hooks ---------------------------------------------------------

    def add(self, path: str, obj: JsonObj) -> JsonObj:
        """Seed an object at ``path`` (its collection) as given, uid included;
        not logged as a request."""
        ref = parse_path(path)
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        if ref.namespace is not None:
            meta["namespace"] = ref.namespace
        key = (ref.prefix, ref.resource, ref.namespace, meta["name"])
        self._writes -= 1  # a seed, not a write
        return self._store(key, stored, "ADDED", path)

    def pause(self, path: str) -> asyncio.Event:
        """Lists of ``path`` wait until the returned event is set."""
        return self._paused.setdefault(path, asyncio.Event())

    def fail(self, method: str, path: str, status: int, times: int = 1) -> None:
        """The next ``times`` requests ``method path`` answer HTTP ``status``."""
        self._failures.append([method, path, status, times])

    def end_watches(self) -> None:
        self._generation += 1
        self._wake()

    def objects(self, path: str) -> list[JsonObj]:
        """What a list of ``path`` would hold now (copies)."""
        ref = parse_path(path)
        return [copy.deepcopy(o) for k, o in sorted(self._objects.items()) if self._in(k, ref)]

    @property
    def writes(self) -> int:
        """Writes that changed something (refused ones and seeds not counted)."""
        return self._writes

    # -- KubeClient ---------------------------------------------------------

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> JsonObj:
        self._request("GET", path)
        ref = parse_path(path)
        if ref.name is not None:
            return copy.deepcopy(self._stored(ref, path))
        if path in self._paused:
            await self._paused[path].wait()
        items = [o for o in self.objects(path) if _selected(o, query or {})]
        return {"items": items, "metadata": {"resourceVersion": str(self._last)}}

    async def create(self, path: str, body: JsonObj) -> JsonObj:
        self._request("POST", path)
        ref = parse_path(path)
        if ref.subresource == "eviction":  # a pod's eviction (no budgets here: fail() for 429)
            pod = self._stored(ref, path)
            want = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
            if want and want != pod["metadata"].get("uid"):
                raise self._error("POST", path, 409, "Conflict", "uid precondition failed")
            await self.delete(path.rsplit("/", 1)[0])
            return {"kind": "Status", "status": "Success"}
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (ref.prefix, ref.resource, ref.namespace, meta["name"])
        if key in self._objects:
            raise self._error("POST", path, 409, "AlreadyExists", f"{meta['name']} already exists")
        if ref.namespace is not None:
            meta["namespace"] = ref.namespace
        meta.update(uid=str(uuid.uuid4()), generation=1,
                    creationTimestamp="2026-12-01T00:00:00Z")  # fmt: skip
        return self._store(key, obj, "ADDED", path)

    async def replace(self, path: str, body: JsonObj) -> JsonObj:
        self._request("PUT", path)
        ref = parse_path(path)
        old = self._stored(ref, path)
        self._precondition(old, body, "PUT", path)
        return self._store(self._key(ref), self._updated(old, body, ref), "MODIFIED", path)

    async def merge_patch(self, path: str, body: JsonObj) -> JsonObj:
        self._request("PATCH", path)
        ref = parse_path(path)
        old = self._stored(ref, path)
        self._precondition(old, body, "PATCH", path)
        return self._store(self._key(ref), self._updated(old, merge(old, body), ref), "MODIFIED",
                           path)  # fmt: skip

    async def apply(
        self, path: str, body: JsonObj, field_manager: str, force: bool = False
    ) -> JsonObj:
        self._request("APPLY", path)
        ref = parse_path(path)
        old = self._stored(ref, path)
        want = (body.get("metadata") or {}).get("uid")
        if want and want != old["metadata"]["uid"]:
            raise self._error("PATCH", path, 409, "Conflict", "the UID does not match")
        return self._store(self._key(ref), self._updated(old, apply_merge(old, body), ref),
                           "MODIFIED", path)  # fmt: skip

    async def delete(self, path: str, body: JsonObj | None = None) -> JsonObj:
        self._request("DELETE", path)
        ref = parse_path(path)
        old = self._stored(ref, path)
        del self._objects[self._key(ref)]
        self._writes += 1
        self._last = next(self._rv)
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._last)
        self._log.append((self._last, "DELETED", self._key(ref), gone))
        self._wake()
        return copy.deepcopy(gone)

    async def watch(
        self, path: str, query: Mapping[str, Any], timeout_seconds: int = 300
    ) -> AsyncIterator[JsonObj]:
        self._request("WATCH", path)
        ref = parse_path(path)
        since = int(query.get("resourceVersion") or self._last)
        generation = self._generation
        while generation == self._generation:
            for rv, kind, key, obj in self._log:
                if rv > since and self._in(key, ref) and _selected(obj, query):
                    since = rv
                    yield {"type": kind, "object": copy.deepcopy(obj)}
            since = max(since, self._last)
            tick = asyncio.Event()
            self._waiters.add(tick)
            try:
                await tick.wait()
            finally:
                self._waiters.discard(tick)

    # -- internals ----------------------------------------------------------

    def _request(self, method: str, path: str) -> None:
        self.requests.append((method, path))
        for failure in self._failures:
            if failure[0] == method and failure[1] == path and failure[3] > 0:
                failure[3] -= 1
                raise self._error(method, path, failure[2], "Injected", "injected failure")

    @staticmethod
    def _error(method: str, path: str, status: int, reason: str, message: str) -> ApiStatusError:
        body = json.dumps({"kind": "Status", "status": "Failure", "reason": reason,
                           "message": message, "code": status})  # fmt: skip
        return ApiStatusError(method, path, status, body)

    @staticmethod
    def _key(ref: _Ref) -> tuple[str, str, str | None, str]:
        assert ref.name is not None
        return (ref.prefix, ref.resource, ref.namespace, ref.name)

    @staticmethod
    def _in(key: tuple[str, str, str | None, str], ref: _Ref) -> bool:
        return key[:2] == (ref.prefix, ref.resource) and ref.namespace in (None, key[2])

    def _stored(self, ref: _Ref, path: str) -> JsonObj:
        obj = self._objects.get(self._key(ref))
        if obj is None:
            raise self._error("GET", path, 404, "NotFound", f"{ref.resource} {ref.name} not found")
        return obj

    def _precondition(self, old: JsonObj, body: JsonObj, method: str, path: str) -> None:
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want and want != old["metadata"]["resourceVersion"]:
            raise self._error(method, path, 409, "Conflict", "the object has been modified")

    @staticmethod
    def _updated(old: JsonObj, new: JsonObj, ref: _Ref) -> JsonObj:
        if ref.subresource == "status":
            out = copy.deepcopy(old)
            out["status"] = copy.deepcopy(new.get("status"))
            return out
        out = copy.deepcopy(new)
        out["metadata"] = {**old["metadata"], **(new.get("metadata") or {})}
        if "status" in old:
            out["status"] = copy.deepcopy(old["status"])
        if out.get("spec") != old.get("spec"):
            out["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        return out

    def _store(self, key: tuple[str, str, str | None, str], obj: JsonObj, kind: str,
               path: str) -> JsonObj:  # fmt: skip
        if self.on_store is not None:
            self.on_store(path, obj)
        self._writes += 1
        self._last = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self._last)
        self._objects[key] = obj
        self._log.append((self._last, kind, key, copy.deepcopy(obj)))
        self._wake()
        return copy.deepcopy(obj)

    def _wake(self) -> None:
        for tick in list(self._waiters):
            tick.set()
