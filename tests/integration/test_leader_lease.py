"""Leader election against the real apiserver: the Lease records patchbay
writes (a takeover, a renewal, a release with an empty holder) are ones the
apiserver stores, two electors whose wall clocks differ by a minute decide
by what each saw change, on its own monotonic clock, and a
``patchbay-controller`` process stopped with SIGTERM gives the Lease up
before it exits, so the standby process takes it next.

Why: the unit tests (tests/unit/test_leader_election.py) run the loops on the
in-memory API, which validates nothing; here each in-process step is one
attempt (``try_acquire_or_renew``) with hand-set clocks, and the process test
checks the order of the Lease's changes in a watch, never a duration.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, watch

from driver.controller.process.leader import LeaderLease, LeaseTiming
from driver.kube.api import KubeApi
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.ports import free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

EPOCH = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
TIMING = LeaseTiming.of(15.0)


@dataclass
class HandClock:
    """A clock the test sets: monotonic seconds and a wall-clock offset."""

    mono: float = 0.0
    wall_offset: float = 0.0

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.mono + self.wall_offset)

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("each attempt is made by the test")


@pytest.fixture
async def api(local_cluster: LocalCluster, namespace: str) -> AsyncIterator[KubeApi]:
    kube = await KubeApi.connect(str(local_cluster.kubeconfig))
    yield kube
    await kube.close()


async def test_the_apiserver_stores_takeover_renewal_and_release(
    api: KubeApi, namespace: str
) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/ctl"
    a_clock, b_clock = HandClock(mono=500.0), HandClock(mono=3.0, wall_offset=60.0)
    a = LeaderLease(api, namespace, "ctl", "a", TIMING, clock=a_clock)
    b = LeaderLease(api, namespace, "ctl", "b", TIMING, clock=b_clock)

    assert await a.try_acquire_or_renew()  # created
    # b's wall clock is a minute ahead: a's renewTime looks long expired to it,
    # but b has only just seen the record, so it waits a lease on its own clock.
    assert not await b.try_acquire_or_renew()
    b_clock.mono += 14.0
    a_clock.mono += 2.0
    assert await a.try_acquire_or_renew()  # renewed: a changed record
    assert not await b.try_acquire_or_renew()  # b saw it change just now
    b_clock.mono += 14.0
    assert not await b.try_acquire_or_renew()  # 14 s without a change: still a's

    b_clock.mono += 1.0  # 15 s unchanged on b's clock: a's lease has expired
    assert await b.try_acquire_or_renew()
    lease = await api.get(path)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    a_clock.mono += 1.0
    assert not await a.try_acquire_or_renew()  # a finds it lost
    assert not a.leading and b.leading

    assert await b.release()
    lease = await api.get(path)
    assert lease["spec"]["holderIdentity"] in ("", None)  # the apiserver may drop ""
    assert lease["spec"]["leaseDurationSeconds"] == 1
    # A new replica (a restarted) takes the empty lease on its first try.
    c = LeaderLease(api, namespace, "ctl", "c", TIMING, clock=HandClock(mono=1.0))
    assert await c.try_acquire_or_renew()
    lease = await api.get(path)
    assert lease["spec"]["holderIdentity"] == "c"
    assert lease["spec"]["leaseTransitions"] == 2


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"the controller exited {self.proc.returncode}:\n{self.tail()}")
        return True


@pytest.fixture
def start_controller(
    local_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[Callable[[str], Controller]]:
    """Starts ``patchbay-controller`` processes by identity, against a fabric
    that never answers (the Lease is all this test looks at)."""
    started: list[Controller] = []
    fabric = f"http://127.0.0.1:{free_port()}"

    def start(identity: str) -> Controller:
        log = tmp_path / f"{identity}.log"
        argv = [
            sys.executable, "-m", "driver.controller.process.main",
            f"--kubeconfig={local_cluster.kubeconfig}", f"--fabric-url={fabric}",
            "--fabric-insecure=true", "--fabric-token=t", f"--lease-namespace={namespace}",
            "--lease-name=ctl", f"--identity={identity}", "--fabric-refresh=300",
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started.append(Controller(proc, log))
        return started[-1]

    yield start
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait(timeout=10)


def test_a_stopped_controller_releases_the_lease_and_the_standby_takes_it(
    api_client: client.ApiClient, namespace: str, start_controller: Callable[[str], Controller]
) -> None:
    leases = client.CoordinationV1Api(api_client)

    def holder() -> str | None:
        try:
            value = leases.read_namespaced_lease("ctl", namespace).spec.holder_identity
        except client.ApiException:
            return None
        return None if value is None else str(value)

    a = start_controller("a")
    wait_for("a holding the lease", lambda: a.alive() and holder() == "a", timeout=60)
    b = start_controller("b")
    wait_for("b waiting", lambda: b.alive() and "waiting for leader lease" in b.tail(), timeout=60)
    since = leases.read_namespaced_lease("ctl", namespace).metadata.resource_version

    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(timeout=30) == 0, a.tail()
    wait_for("b holding the lease", lambda: holder() == "b", timeout=60)

    # Every change since a was still leading, in order, from the apiserver's watch.
    seen: list[str] = []
    for event in watch.Watch().stream(
        leases.list_namespaced_lease, namespace, resource_version=since, timeout_seconds=1
    ):
        name = event["object"].spec.holder_identity or ""
        if not seen or seen[-1] != name:
            seen.append(name)
        if name == "b":
            break
    assert seen[-2:] == ["", "b"] and set(seen[:-2]) <= {"a"}, seen  # a released, then b
    assert "leader lease" in a.tail() and "released by a" in a.tail()
    assert "acquired by b" in b.tail()
