"""Leader election (``driver.controller.process.leader``) between replicas whose clocks
disagree, on a simulated timeline against the in-memory API.

Why: only one controller may attach and detach at a time. Each replica
here runs as the controller runs it (``acquire``, then ``keep`` until it
returns, then the process ends and restarts as a follower; a stopped leader
``release``s). Time is a shared virtual timeline: every replica sleeps on it
and reads its own monotonic and wall clock from it, with its own offsets, so
a 60 s wall-clock skew costs no real time and no assertion depends on the
machine's speed. Who leads is recorded at every write of the Lease.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import itertools
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from driver.controller.process.leader import JITTER_FACTOR, LeaderLease, LeaseTiming
from driver.errors import ApiError
from driver.kube.client import JsonObj
from driver.kube.memory import MemoryKube

LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/patchbay-controller"
TIMING = LeaseTiming.of(15.0)  # client-go's 15 s / 10 s / 2 s
EPOCH = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


class Timeline:
    """Virtual time shared by the replicas: a sleep ends when the test moves
    time to it, after everything runnable has run."""

    def __init__(self) -> None:
        self.t = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + seconds, next(self._seq), fut))
        await fut

    async def run_until(self, end: float) -> None:
        while True:
            for _ in range(50):  # let every woken task run to its next sleep
                await asyncio.sleep(0)
            while self._sleepers and self._sleepers[0][2].done():  # cancelled
                heapq.heappop(self._sleepers)
            if not self._sleepers or self._sleepers[0][0] > end:
                self.t = end
                return
            when, _, fut = heapq.heappop(self._sleepers)
            self.t = max(self.t, when)
            fut.set_result(None)


@dataclass
class SkewedClock:
    """One replica's clocks: its own monotonic origin and wall-clock offset."""

    timeline: Timeline
    wall_offset: float
    mono_origin: float

    def monotonic(self) -> float:
        return self.mono_origin + self.timeline.t

    def now(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.timeline.t + self.wall_offset)

    async def sleep(self, seconds: float) -> None:
        await self.timeline.sleep(seconds)


@dataclass
class Link:
    """One replica's connection to the apiserver: it can be cut; its requests
    are logged in the shared event list."""

    api: MemoryKube
    name: str
    events: list[tuple[str, ...]]
    cut: bool = False

    def _send(self, method: str) -> None:
        if self.cut:
            raise ApiError(f"{self.name}: connection refused")
        self.events.append((self.name, method))

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> JsonObj:
        self._send("GET")
        return await self.api.get(path, query)

    async def create(self, path: str, body: JsonObj) -> JsonObj:
        self._send("POST")
        return await self.api.create(path, body)

    async def replace(self, path: str, body: JsonObj) -> JsonObj:
        self._send("PUT")
        return await self.api.replace(path, body)

    async def merge_patch(self, path: str, body: JsonObj) -> JsonObj:
        raise AssertionError("the lease is written whole")

    async def apply(
        self, path: str, body: JsonObj, field_manager: str, force: bool = False
    ) -> JsonObj:
        raise AssertionError("the lease is written whole")

    async def delete(self, path: str, body: JsonObj | None = None) -> JsonObj:
        raise AssertionError("the lease is never deleted")

    def watch(
        self, path: str, query: Mapping[str, Any], timeout_seconds: int = 300
    ) -> AsyncIterator[JsonObj]:
        raise AssertionError("not watched")


@dataclass
class Replica:
    """A controller process, restarted as a follower when its lease is lost."""

    name: str
    link: Link
    clock: SkewedClock
    seed: int
    leading: bool = False
    restarts: int = 0
    elector: LeaderLease | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def identity(self) -> str:
        return f"{self.name}-{self.restarts}"  # a new process, a new identity (host-pid)

    async def run(self) -> None:
        while True:
            self.elector = LeaderLease(
                self.link, "kube-system", "patchbay-controller", self.identity(), TIMING,
                clock=self.clock, rand=random.Random(self.seed + self.restarts).random,
            )  # fmt: skip
            await self.elector.acquire()
            self.leading = True
            await self.elector.keep()  # returns: the process exits 5 ...
            self.leading = False
            self.restarts += 1  # ... and its Deployment starts it again

    async def stop(self) -> None:
        """SIGTERM: the reconciler stops, then the lease is given up."""
        assert self.task is not None and self.elector is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.leading = False
        await self.elector.release()


@dataclass
class Cluster:
    api: MemoryKube
    timeline: Timeline
    events: list[tuple[str, ...]] = field(default_factory=list)
    replicas: dict[str, Replica] = field(default_factory=dict)
    # At each write of the Lease: (holder it writes, replicas leading then).
    changes: list[tuple[str, frozenset[str]]] = field(default_factory=list)

    def on_store(self, path: str, obj: JsonObj) -> None:
        if path.startswith(LEASE.rsplit("/", 1)[0]):
            holder = (obj.get("spec") or {}).get("holderIdentity") or ""
            leading = frozenset(r.name for r in self.replicas.values() if r.leading)
            self.changes.append((holder, leading))
            self.events.append(("lease", holder))

    def start(self, name: str, wall_offset: float, mono_origin: float, seed: int) -> Replica:
        clock = SkewedClock(self.timeline, wall_offset, mono_origin)
        replica = Replica(name, Link(self.api, name, self.events), clock, seed)
        replica.task = asyncio.create_task(replica.run())
        self.replicas[name] = replica
        return replica

    def leaders_at_changes(self) -> list[str]:
        """Who led at each Lease write, writer included; consecutive repeats once."""
        out: list[str] = []
        for holder, leading in self.changes:
            now = set(leading) | ({holder.split("-")[0]} if holder else set())
            assert len(now) <= 1, f"two leaders at once: {sorted(now)}"
            if now and (not out or out[-1] != min(now)):
                out.append(min(now))
        return out


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    api = MemoryKube()
    c = Cluster(api, Timeline())
    api.on_store = c.on_store
    yield c
    for replica in c.replicas.values():
        if replica.task is not None:
            replica.task.cancel()
    await asyncio.gather(*(r.task for r in c.replicas.values() if r.task), return_exceptions=True)


@pytest.mark.parametrize("skew", [60.0, -60.0])
async def test_replicas_whose_wall_clocks_differ_by_a_minute_never_both_lead(
    cluster: Cluster, skew: float
) -> None:
    a = cluster.start("a", wall_offset=0.0, mono_origin=1000.0, seed=1)
    await cluster.timeline.run_until(1.0)
    b = cluster.start("b", wall_offset=skew, mono_origin=7.0, seed=2)
    await cluster.timeline.run_until(60.0)  # four lease durations of a renewing leader
    assert cluster.leaders_at_changes() == ["a"]  # (it asserts one leader at each change)
    assert a.leading and not b.leading

    a.link.cut = True  # the leader loses the apiserver: it steps down, b takes over
    # a stops by 60 + 10 (renew deadline); b saw a's last write by 64.4 (a jittered
    # retry), so on b's own clock it expires by 79.4, and b's next try is by 83.8.
    await cluster.timeline.run_until(90.0)
    assert cluster.leaders_at_changes() == ["a", "b"]
    assert b.leading and not a.leading
    a.link.cut = False
    await cluster.timeline.run_until(150.0)
    assert b.leading and not a.leading and a.restarts == 1
    assert cluster.leaders_at_changes() == ["a", "b"]


async def test_a_stopped_leader_empties_the_lease_and_the_follower_takes_it_next_try(
    cluster: Cluster,
) -> None:
    a = cluster.start("a", wall_offset=0.0, mono_origin=50.0, seed=3)
    await cluster.timeline.run_until(1.0)
    b = cluster.start("b", wall_offset=-60.0, mono_origin=9.0, seed=4)
    await cluster.timeline.run_until(30.0)
    assert a.leading and not b.leading

    await a.stop()
    cluster.events.append(("a", "exited"))
    (lease,) = cluster.api.objects(LEASE.rsplit("/", 1)[0])
    assert lease["spec"]["holderIdentity"] == ""  # empty right after the leader exits
    assert lease["spec"]["leaseDurationSeconds"] == 1
    await cluster.timeline.run_until(60.0)

    after = cluster.events[cluster.events.index(("a", "exited")) :]
    # b's next try after a's exit reads the empty lease and takes it: no wait for expiry.
    assert after[:4] == [("a", "exited"), ("b", "GET"), ("b", "PUT"), ("lease", "b-0")]
    assert b.leading
    assert cluster.leaders_at_changes() == ["a", "b"]
    assert lease["spec"]["leaseTransitions"] == 0
    assert cluster.api.objects(LEASE.rsplit("/", 1)[0])[0]["spec"]["leaseTransitions"] == 1


async def test_followers_retry_on_the_jittered_retry_period(cluster: Cluster) -> None:
    cluster.start("a", wall_offset=0.0, mono_origin=0.0, seed=5)
    await cluster.timeline.run_until(0.5)
    got: dict[str, list[float]] = {"b": [], "c": []}
    api_get = cluster.api.get

    async def timed_get(path: str, query: Mapping[str, Any] | None = None) -> JsonObj:
        if cluster.events and cluster.events[-1][0] in got:
            got[cluster.events[-1][0]].append(cluster.timeline.t)
        return await api_get(path, query)

    cluster.api.get = timed_get  # type: ignore[method-assign]
    cluster.start("b", wall_offset=0.0, mono_origin=0.0, seed=6)
    cluster.start("c", wall_offset=0.0, mono_origin=0.0, seed=7)
    await cluster.timeline.run_until(60.0)
    for name, times in got.items():
        gaps = [round(y - x, 6) for x, y in itertools.pairwise(times)]
        assert len(gaps) > 10, name
        low, high = TIMING.retry_period, TIMING.retry_period * (1 + JITTER_FACTOR)
        assert all(low <= g <= high for g in gaps), (name, gaps)
    assert got["b"][1:] != got["c"][1:]  # started together, they spread out


async def test_a_leader_rides_out_failed_renewals_shorter_than_its_deadline(
    cluster: Cluster,
) -> None:
    a = cluster.start("a", wall_offset=0.0, mono_origin=0.0, seed=8)
    await cluster.timeline.run_until(1.0)
    b = cluster.start("b", wall_offset=30.0, mono_origin=0.0, seed=9)
    await cluster.timeline.run_until(20.0)
    a.link.cut = True
    await cluster.timeline.run_until(20.0 + TIMING.renew_deadline / 2)
    a.link.cut = False
    await cluster.timeline.run_until(80.0)
    assert a.leading and a.restarts == 0 and not b.leading
    assert cluster.leaders_at_changes() == ["a"]


def test_a_lease_too_short_for_the_retry_period_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lease_duration 3\.0s is too short"):
        LeaseTiming.of(3.0)


def test_the_controller_refuses_such_a_lease_naming_the_setting() -> None:
    from driver.controller.process.settings import ControllerSettings
    from driver.errors import ConfigError
    from driver.settingsflags import parse_settings

    argv = ["--fabric-url=https://fabric:8443", "--fabric-token=t", "--lease-duration=3"]
    with pytest.raises(ConfigError, match=r"--lease-duration / LEASE_DURATION 3\.0s is too short"):
        parse_settings(ControllerSettings, argv, environ={})


@dataclass
class StillClock:
    def monotonic(self) -> float:
        return 0.0

    def now(self) -> dt.datetime:
        return EPOCH

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("each attempt is made by the test")


@pytest.mark.parametrize(("landed_by", "released"), [("me", True), ("other", False)])
async def test_release_after_a_write_it_did_not_see_answered(
    landed_by: str, released: bool
) -> None:
    # SIGTERM cut a renewal short, but the apiserver stored it (our resourceVersion
    # is stale): the release reads the lease again and clears it only if it is ours.
    api = MemoryKube()
    me = LeaderLease(api, "kube-system", "patchbay-controller", "me", TIMING, clock=StillClock())
    assert await me.try_acquire_or_renew()
    (lease,) = api.objects(LEASE.rsplit("/", 1)[0])
    lease["spec"]["holderIdentity"] = landed_by
    await api.replace(LEASE, lease)
    assert await me.release() is released
    assert api.objects(LEASE.rsplit("/", 1)[0])[0]["spec"]["holderIdentity"] == (
        "" if released else "other"
    )
    assert not me.leading
