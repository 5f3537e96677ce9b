"""The lease keeper's world for unit tests: the shipped in-memory API (its
evictions kept), an injected wall and monotonic clock, the recorder, a
namespace and a policy; claims and pods made and allocated as the scheduler
and the resource-claim controller would (docs/leases.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from driver.controller.events import CONTROLLER, ControllerEvents
from driver.controller.leases.keeper import LeaseKeeper
from driver.controller.leases.policies import POLICIES_PATH
from driver.kube.api import RESOURCE_V1
from driver.kube.events import EVENTS_V1, EventRecorder
from driver.kube.memory import MemoryKube
from driver.leaseterms import HOLDER, stamp
from driver.metrics import CONTROLLER as REGISTRY

T0 = 1_796_083_200.0  # 2026-12-01T00:00:00Z
NS = "team-a"
CLAIMS = f"{RESOURCE_V1}/namespaces/{NS}/resourceclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"
POLICY = {
    "metadata": {"name": "notebooks"},
    "spec": {"deviceClassNames": ["gpu.patchbay.dev"], "defaultDuration": "1h",
             "maxDuration": "8h", "warningBefore": "10m", "evictionGracePeriodSeconds": 7,
             "maxExtension": "2h", "maxExtensionTotal": "3h"},
}  # fmt: skip


def claim(name: str, owner: str = "", **notes: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": {HOLDER: "alice", **notes}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner,
                                    "uid": owner + "-uid", "controller": True}]  # fmt: skip
    spec = {
        "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}
    }
    return {"metadata": meta, "spec": spec}


class Api(MemoryKube):
    """The in-memory API, keeping each eviction's body."""

    def __init__(self) -> None:
        super().__init__()
        self.evictions: list[dict[str, Any]] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/eviction"):
            self.evictions.append(body)
        return await super().create(path, body)


class World:
    def __init__(self) -> None:
        self.api = Api()
        self.now, self.mono = T0, 0.0
        self.recorder = EventRecorder(self.api, CONTROLLER, "ctl-0")
        self.api.add("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {"team": "nb"}}})
        self.api.add(POLICIES_PATH, POLICY)
        self.tasks: list[asyncio.Task[None]] = [asyncio.create_task(self.recorder.run())]

    async def keeper(self) -> LeaseKeeper:
        """A keeper with its caches filled (a fresh one: a restart, a new leader)."""
        keeper = LeaseKeeper(self.api, ControllerEvents(self.recorder),
                             wall=lambda: self.now, monotonic=lambda: self.mono)  # fmt: skip
        for cache in (keeper.claims, keeper.policies, keeper.namespaces):
            self.tasks.append(asyncio.create_task(cache.run()))
        for _ in range(1000):
            if keeper.synced():
                return keeper
            await asyncio.sleep(0)
        raise AssertionError("caches not synced")

    async def caught_up(self, keeper: LeaseKeeper) -> None:
        """Until the keeper's claim cache holds what the API stores."""
        for _ in range(1000):
            stored = {c["metadata"]["name"]: c["metadata"]["resourceVersion"]
                      for c in self.api.objects(CLAIMS)}  # fmt: skip
            seen = {c["metadata"]["name"]: c["metadata"]["resourceVersion"]
                    for c in keeper.claims.objects.values()}  # fmt: skip
            if stored == seen:
                return
            await asyncio.sleep(0)
        raise AssertionError("claim cache behind")

    async def allocate(
        self, name: str, pods: tuple[str, ...], at: float | None = T0, devices: tuple[str, ...] = ()
    ) -> None:
        """Allocate claim ``name`` (its ``devices`` of ours, on pool ``node-a``)
        and reserve it for ``pods``, made where they do not exist."""
        results = [{"request": "g", "driver": "patchbay.dev", "pool": "node-a", "device": d}
                   for d in devices]  # fmt: skip
        alloc: dict[str, Any] = {"devices": {"results": results}}
        if at is not None:
            alloc["allocationTimestamp"] = stamp(at)
        for p in pods:
            if not any(o["metadata"]["name"] == p for o in self.api.objects(PODS)):
                await self.api.create(PODS, {"metadata": {"name": p, "uid": p + "-uid"}})
        pod_uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in self.api.objects(PODS)}
        reserved = [{"resource": "pods", "name": p, "uid": pod_uids[p]} for p in pods]
        status = {"status": {"allocation": alloc, "reservedFor": reserved}}
        await self.api.merge_patch(f"{CLAIMS}/{name}/status", status)

    async def mark(self, name: str, conditions: dict[str, dict[str, Any] | None]) -> None:
        """Write the node's ``Idle`` condition per device of claim ``name`` (None: none)."""
        entries = []
        for device, cond in conditions.items():
            entry: dict[str, Any] = {"driver": "patchbay.dev", "pool": "node-a", "device": device}
            entry["conditions"] = [cond] if cond is not None else []
            entries.append(entry)
        await self.api.merge_patch(f"{CLAIMS}/{name}/status", {"status": {"devices": entries}})

    def notes(self, name: str) -> dict[str, str]:
        (found,) = [c for c in self.api.objects(CLAIMS) if c["metadata"]["name"] == name]
        return dict(found["metadata"].get("annotations") or {})

    async def events(self) -> list[tuple[str, str, str]]:
        await self.recorder.drain()
        return [(e["regarding"]["kind"], e["regarding"]["name"], e["reason"])
                for e in sorted(self.api.objects(f"{EVENTS_V1}/namespaces/{NS}/events"),
                                key=lambda e: int(e["metadata"]["resourceVersion"]))]  # fmt: skip

    def pods(self) -> list[str]:
        return sorted(o["metadata"]["name"] for o in self.api.objects(PODS))


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    yield w
    for t in w.tasks:
        t.cancel()
    await asyncio.gather(*w.tasks, return_exceptions=True)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0
