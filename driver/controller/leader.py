"""Leader election through a coordination.k8s.io Lease.

Why: two controller replicas may run (rolling updates, HA); only one may
attach, detach and publish. The holder renews the Lease every third of its
duration; another replica takes it over once ``renewTime + duration`` has
passed. Optimistic concurrency (the Lease's resourceVersion) decides races.
Concurrency: :meth:`LeaderLease.acquire` and :meth:`LeaderLease.keep` are
coroutines on the controller's loop; ``keep`` returns (and the controller
stops) as soon as the lease is lost or cannot be renewed in time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any

from driver.errors import ApiError, ApiStatusError
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(ts: str | None) -> float:
    if not ts:
        return 0.0
    ts = ts.replace("Z", "+00:00")
    return dt.datetime.fromisoformat(ts).timestamp()


class LeaderLease:
    def __init__(self, api: KubeClient, namespace: str, name: str, identity: str, duration: float):
        self._api = api
        self._ns, self._name = namespace, name
        self._base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.identity = identity
        self.duration = duration

    def _spec(self, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(self.duration)),
            "acquireTime": _now(),
            "renewTime": _now(),
            "leaseTransitions": transitions,
        }

    async def try_acquire(self) -> bool:
        """One attempt to become (or stay) the holder."""
        try:
            lease = await self._api.get(f"{self._base}/{self._name}")
        except ApiStatusError as exc:
            if not exc.not_found:
                raise
            body = {"metadata": {"name": self._name}, "spec": self._spec(0)}
            try:
                await self._api.create(self._base, body)
            except ApiStatusError as err:
                if err.conflict:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        expires = _parse(spec.get("renewTime")) + float(spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and time.time() < expires:
            return False
        new = self._spec(int(spec.get("leaseTransitions") or 0) + (holder != self.identity))
        if holder == self.identity:
            new["acquireTime"] = spec.get("acquireTime") or new["acquireTime"]
        lease["spec"] = new
        try:
            await self._api.replace(f"{self._base}/{self._name}", lease)
        except ApiStatusError as exc:
            if exc.conflict:
                return False
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this replica holds the lease."""
        logged = False
        while True:
            try:
                if await self.try_acquire():
                    log.info(
                        "leader lease %s/%s acquired by %s", self._ns, self._name, self.identity
                    )
                    return
            except ApiError as exc:
                log.warning("leader election: %s", exc)
            if not logged:
                log.info("waiting for leader lease %s/%s", self._ns, self._name)
                logged = True
            await asyncio.sleep(self.duration / 3)

    async def keep(self) -> None:
        """Renew until the lease is lost; returns then."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.duration / 3)
            try:
                if not await self.try_acquire():
                    log.error("leader lease lost to another replica")
                    return
                last_ok = time.monotonic()
            except ApiError as exc:
                log.warning("renewing the leader lease failed: %s", exc)
                if time.monotonic() - last_ok > self.duration * 2 / 3:
                    log.error("leader lease not renewed in time; stepping down")
                    return
