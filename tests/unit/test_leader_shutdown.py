"""The controller's leader wiring (``driver.controller.process.main``): a stopped
leader cancels its attach and detach tasks (the reconciler stops its
workers) before it gives the Lease up, and a lost lease still ends the
process with exit code 5 without a release.

Why: a follower takes a released Lease on its next try, so anything the old
leader still does after the release overlaps with the new leader. The
controller runs here on the shipped in-memory API and fabric; SIGTERM is
the handler ``_run`` installs, called directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from driver.controller.process import main
from driver.controller.process.leader import LeaseTiming
from driver.controller.process.settings import ControllerSettings
from driver.controller.reconciler import Reconciler
from driver.errors import LeaseLost
from driver.fabricclient.memory import MemoryFabric
from driver.kube.memory import MemoryKube
from tests.signals import Signal

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"


class Api(MemoryKube):
    async def close(self) -> None:
        pass


class Fabric(MemoryFabric):
    async def __aenter__(self) -> Fabric:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


@pytest.fixture
async def controller(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Api, list[tuple[str, str]], Signal]:
    """The in-memory controller: its API, the log of lease writes and
    fabric-task ends, and a signal on each."""
    api, events, changed = Api(), [], Signal()

    def on_store(path: str, obj: dict[str, Any]) -> None:
        if path.startswith(LEASES):
            events.append(("lease", (obj.get("spec") or {}).get("holderIdentity") or ""))
            changed.changed()

    api.on_store = on_store

    async def connect(*_: Any) -> Api:
        return api

    monkeypatch.setattr("driver.kube.api.KubeApi.connect", connect)
    monkeypatch.setattr("driver.fabricclient.client.FabricClient", lambda *_a, **_k: Fabric([]))
    # Renewals 50 ms apart on the loop's clock: the test waits on writes, not periods.
    monkeypatch.setattr(ControllerSettings, "lease_timing", lambda _s: LeaseTiming(15, 10, 0.05))
    return api, events, changed


def settings() -> ControllerSettings:
    return ControllerSettings(
        fabric_url="http://fabric", fabric_token="t", fabric_insecure=True, identity="me"
    )


def sigterm_of(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    handlers: list[Callable[[], None]] = []
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "add_signal_handler", lambda _sig, cb: handlers.append(cb))
    return handlers


async def test_a_stopped_leader_cancels_its_attaches_then_releases(
    controller: tuple[Api, list[tuple[str, str]], Signal], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, events, changed = controller
    handlers = sigterm_of(monkeypatch)
    made: list[Reconciler] = []
    init = Reconciler.__init__

    def recorded(self: Reconciler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Reconciler, "__init__", recorded)
    run = asyncio.create_task(main._run(settings()))
    await changed.until("the lease renewed", lambda: events[-2:] == [("lease", "me")] * 2)

    async def attaching() -> None:  # an attach the workers started, still running
        try:
            await asyncio.Event().wait()
        finally:
            events.append(("attach-gpu-0", "ended"))

    (reconciler,) = made
    reconciler.workers._start("gpu-0", attaching(), "attach-gpu-0")
    (attach,) = [t for t in asyncio.all_tasks() if t.get_name() == "attach-gpu-0"]
    await asyncio.sleep(0)
    handlers[0]()  # SIGTERM
    await run
    assert attach.cancelled()
    ended = events.index(("attach-gpu-0", "ended"))
    assert events[ended + 1 :] == [("lease", "")]  # the release, after the attach ended
    (lease,) = api.objects(LEASES)
    assert lease["spec"]["holderIdentity"] == "" and lease["spec"]["leaseDurationSeconds"] == 1


async def test_a_lost_lease_ends_the_run_with_lease_lost_and_no_release(
    controller: tuple[Api, list[tuple[str, str]], Signal], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, events, changed = controller
    sigterm_of(monkeypatch)
    run = asyncio.create_task(main._run(settings()))
    await changed.until("the lease held", lambda: ("lease", "me") in events)
    (lease,) = api.objects(LEASES)
    lease["spec"]["holderIdentity"] = "other"  # another replica took it
    await api.replace(f"{LEASES}/patchbay-controller", lease)
    with pytest.raises(ExceptionGroup) as caught:
        await run
    assert caught.group_contains(LeaseLost)  # exit code 5 (tests/unit/test_process_exit.py)
    assert events[-1] == ("lease", "other")  # not released: it was not ours any more
