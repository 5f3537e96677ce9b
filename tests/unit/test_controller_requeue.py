"""An abandoned allocation's pool is written again once the scheduler let go of it.

The 1.37 scheduler holds an allocation in flight while PreBind waits for its
binding conditions, and lets go of it without an event when the claim is
deleted meanwhile (driver/controller/requeue.py): pods it refused in
between wait for the five-minute flush. The controller renews the pool
(same devices, a new generation) after the scheduler's poll: the slice
update moves them back. Nothing is written for an allocation that got
ready, or whose claim is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from driver.controller import claims as cl
from driver.controller.reconciler import Reconciler
from driver.controller.requeue import PREBIND_POLL_S, Requeue
from driver.kube.api import slice_path
from tests.signals import Signal
from tests.unit.controller_world import World, running, settings

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
POOL = "fabric/pcie0.sw0"


def alloc(uid: str, *, ready: bool = False, waits: bool = True) -> cl.FabricAllocation:
    return cl.FabricAllocation(uid, "default", uid, "fgpu-0", ready, False, waits=waits, pool=POOL)


def claim_obj(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "default", "uid": uid}}


class Renewals(list[str | None]):
    """The pools renewed; ``wanted``: those that exist (None: any one)."""

    def __init__(self, *wanted: str | None) -> None:
        super().__init__()
        self.wanted = wanted or (POOL, None)

    def __call__(self, pool: str | None) -> bool:
        self.append(pool)
        return pool in self.wanted


class Later:
    """``call_later`` as a list the test fires."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> None:
        self.calls.append((delay, callback))


def test_only_a_deleted_claim_whose_allocation_never_got_ready_renews_its_pool() -> None:
    renewed, later = Renewals(), Later()
    requeue = Requeue("fabric", renewed, later=later)
    requeue.note([alloc("waits"), alloc("ready", ready=True), alloc("spare", waits=False)],
                 [claim_obj(u) for u in ("waits", "ready", "spare", "kept")])  # fmt: skip
    requeue.note([alloc("kept")], [claim_obj(u) for u in ("waits", "ready", "spare", "kept")])
    assert later.calls == []  # all there (waits: deallocated, not deleted yet)
    requeue.note([], [])  # every claim deleted
    ((delay, fire), (_, fire_kept)) = later.calls
    assert delay > PREBIND_POLL_S  # after the scheduler's poll found the claim gone
    assert renewed == []
    fire()
    fire_kept()
    assert renewed == [POOL, POOL]
    requeue.note([], [])
    assert len(later.calls) == 2  # once per claim


def test_an_allocation_only_a_watch_event_showed_counts() -> None:
    """The scheduler writes the allocation for a pod already deleted and the
    claim controller takes it back at once: no pass may see it allocated."""
    renewed, later = Renewals(), Later()
    requeue = Requeue("fabric", renewed, later=later)
    result = {"request": "gpu", "driver": "patchbay.dev", "pool": POOL, "device": "fgpu-0",
              "bindingConditions": ["FabricDeviceReady"]}  # fmt: skip
    allocated = {**claim_obj("uid-1"), "status": {"allocation": {"devices": {"results": [result]}}}}
    requeue.seen("MODIFIED", allocated)
    requeue.seen("MODIFIED", claim_obj("uid-1"))  # deallocated
    requeue.seen("DELETED", claim_obj("uid-1"))
    requeue.note([], [])  # the pass after: the claim gone, never seen allocated by a pass
    ((_, fire),) = later.calls
    fire()
    assert renewed == [POOL]


def test_a_pool_no_longer_wanted_renews_another() -> None:
    asked, later = Renewals(None), Later()
    requeue = Requeue("fabric", asked, later=later)
    requeue.note([alloc("uid-1")], [claim_obj("uid-1")])
    requeue.note([], [])
    later.calls[0][1]()
    assert asked == [POOL, None]


async def test_the_controller_renews_the_pool_of_an_allocation_deleted_while_it_attached() -> None:
    w = World(1)
    w.fabric.instant = False  # the attach stays under way: the claim never gets ready
    result = {"request": "gpu", "driver": "patchbay.dev", "pool": POOL, "device": "",
              "bindingConditions": ["FabricDeviceReady"],
              "bindingFailureConditions": ["FabricDeviceFailed"]}  # fmt: skip
    selector = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}  # fmt: skip
    rec = Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))
    later, asked = Later(), Signal()

    def captured(delay: float, callback: Callable[[], None]) -> None:
        later(delay, callback)
        asked.changed()

    rec.requeue.later = captured

    def stored() -> list[tuple[int, list[str]]]:  # the domain pool (not node-a's adapters)
        return [(s["spec"]["pool"]["generation"], [d["name"] for d in s["spec"]["devices"]])
                for s in w.api.objects(slice_path())
                if s["spec"]["pool"]["name"] == POOL]  # fmt: skip

    async with running(rec):
        await w.changed.until("the domain pool", lambda: stored() != [])
        ((generation, devices),) = stored()
        result["device"] = devices[0]
        w.api.add(CLAIMS, {
            "metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
            "status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": selector}},
        })  # fmt: skip
        await w.changed.until("the attach asked", lambda: w.fabric.attached != [])
        await w.api.delete(f"{CLAIMS}/claim")  # the pod went while PreBind waited
        await asked.until("the renewal planned", lambda: later.calls != [])
        assert stored() == [(generation, devices)]  # nothing written before the scheduler's poll
        later.calls[0][1]()
        await w.changed.until("the pool renewed", lambda: stored()[0][0] > generation)
    assert stored() == [(generation + 1, devices)]  # the same device, a new generation
