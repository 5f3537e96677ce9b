"""A fabric GPU its node found failed (issue 38, the fabric path), per-domain shape.

The node names it in its ``patchbay.dev/fabric`` report (``failed``); the
real reconciler taints it in its domain pool with the node's effect and
reason, detaches it once the node holds it prepared no more (its claim may
still be allocated), keeps it in the pool tainted ``NoSchedule`` (held out,
never a spare), keeps it so across a restart (read back from the pool's own
slices), and offers it again once the fabric manager reported it Critical
and then OK, or an operator cleared it. On the shipped in-memory API and
fabric (tests/unit/controller_world.py).
"""

from __future__ import annotations

from typing import Any

from driver.controller.health.failures import CLEAR_ANNOTATION, FabricFailures
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    READY_CONDITION,
    device_name,
)
from driver.kube.api import slice_path
from tests.unit.controller_world import MODEL, running, settings
from tests.unit.domain_claims import CLAIMS, NAME, POOL, claim, condition
from tests.unit.failing_world import FAILURE, KEY, Failing


def per_domain() -> Any:
    return settings(fabric_pool_shape="per-domain")


async def failed_and_detached(w: Failing, rec: Reconciler) -> None:
    """gpu-0 attached for a claim, used, found failed, then no longer used."""
    w.api.add(CLAIMS, claim("node-a"))
    await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
    w.busy, w.failed = {"GPU-0"}, {"GPU-0": FAILURE}
    await w.report()
    await w.changed.until("the taint", lambda: bool(w.taints()))
    assert w.fabric.devices["gpu-0"].connection is not None  # its pod still holds it
    w.busy = set()  # the pod is gone (evicted): the node unprepared the claim
    await w.report()
    await w.changed.until("the detach", lambda: w.fabric.devices["gpu-0"].connection is None)
    await w.changed.until("held out", lambda: w.taints()[0]["effect"] == "NoSchedule")


async def test_the_node_reported_failure_taints_the_device_with_its_effect_and_reason() -> None:
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        w.api.add(CLAIMS, claim("node-a"))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        assert w.taints() == []
        w.busy, w.failed = {"GPU-0"}, {"GPU-0": FAILURE}
        await w.report()
        await w.changed.until("the taint", lambda: bool(w.taints()))
        (taint,) = w.taints()
        assert rec.failures.samples() == [(("attached",), 1.0), (("held",), 0.0)]
        assert taint == {"key": KEY, "value": "xid-79", "effect": "NoExecute",
                         "timeAdded": FAILURE.since}  # fmt: skip
        assert w.taints(device_name("GPU-1")) == []  # the other GPU is offered as before
        assert w.fabric.devices["gpu-0"].connection is not None  # a prepared claim uses it
        assert w.fabric.detached == []


async def test_detached_once_its_pods_are_gone_and_held_out_with_its_reason() -> None:
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        await failed_and_detached(w, rec)
        # The claim is still allocated (its pod is gone): the device stays
        # published (allocated by that name) and detached, with the reason.
        (taint,) = w.taints()
        assert (taint["value"], taint["effect"]) == ("xid-79", "NoSchedule")
        assert rec.failures.samples() == [(("attached",), 0.0), (("held",), 1.0)]
        assert w.fabric.detached == ["gpu-0"]
        await w.api.delete(f"{CLAIMS}/claim")  # released: still held out
        await w.changed.until("the pool without the claim", lambda: not w.api.objects(CLAIMS))
        rec.refresh_fabric()
        await w.changed.until("still held out", lambda: [t["effect"] for t in w.taints()]
                              == ["NoSchedule"])  # fmt: skip
        assert "gpu-0" in rec.failures and w.fabric.attached.count(("gpu-0", "node-a",
                                                                     "adapter0")) == 1  # fmt: skip


async def test_a_restart_keeps_it_held_out() -> None:
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        await failed_and_detached(w, rec)
    again = Reconciler(w.api, w.fabric, per_domain())
    stored = sum(1 for _ in w.api.objects(slice_path()))
    async with running(again):
        await w.changed.until("the first pass", lambda: again.published != {})
        await w.changed.until("the record read back", lambda: "gpu-0" in again.failures)
        failure = again.failures.failure("gpu-0")
        assert failure is not None and failure.reason == "xid-79"
        assert [t["effect"] for t in w.taints()] == ["NoSchedule"]
    assert stored == sum(1 for _ in w.api.objects(slice_path()))
    # Without the record in the pool, a new controller offers it at once.
    fresh = FabricFailures(again.events)
    fresh.restore({})
    assert "gpu-0" not in fresh


async def test_offered_again_once_the_fabric_manager_reports_it_critical_then_ok() -> None:
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        await failed_and_detached(w, rec)
        await w.api.delete(f"{CLAIMS}/claim")  # released: published for no allocation
        w.health(rec, "Warning")  # not a verdict: still held out
        await w.changed.until("the pool without the claim", lambda: not w.api.objects(CLAIMS))
        assert [t["effect"] for t in w.taints()] == ["NoSchedule"]
        w.health(rec, "Critical")
        await w.changed.until("the manager holds it", lambda: NAME not in w.devices())
        assert "gpu-0" not in rec.failures
        w.health(rec, "OK")
        await w.changed.until("offered again", lambda: NAME in w.devices())
        assert w.taints() == []


async def test_offered_again_once_an_operator_cleared_it() -> None:
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        await failed_and_detached(w, rec)
        old = {CLEAR_ANNOTATION: f"{NAME}@2026-12-03T09:59:59Z"}  # before the failure
        await w.api.merge_patch("/api/v1/nodes/node-a", {"metadata": {"annotations": old}})
        await w.changed.until(
            "the node seen",
            lambda: (
                rec.nodes.objects["node-a"]["metadata"]["annotations"].get(CLEAR_ANNOTATION)
                == old[CLEAR_ANNOTATION]
            ),
        )
        rec.reconcile()
        await rec.publisher.in_sync.wait()
        assert [t["effect"] for t in w.taints()] == ["NoSchedule"]
        now = {CLEAR_ANNOTATION: f"x@bad,{NAME}@2026-12-03T10:00:00Z"}
        await w.api.merge_patch("/api/v1/nodes/node-a", {"metadata": {"annotations": now}})
        await w.changed.until("offered again", lambda: w.taints() == [] and NAME in w.devices())
        assert "gpu-0" not in rec.failures


async def test_a_pool_with_a_tainted_device_is_split_into_slices_of_at_most_64() -> None:
    w = Failing(gpus=70)
    rec = Reconciler(w.api, w.fabric, per_domain())

    def sizes() -> list[int]:
        return sorted(len(s["spec"]["devices"]) for s in w.api.objects(slice_path())
                      if s["spec"]["pool"]["name"] == POOL)  # fmt: skip

    async with running(rec):
        await w.changed.until("the pool", lambda: sum(sizes()) == 70)
        assert sizes() == [70]
        w.api.add(CLAIMS, claim("node-a"))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        w.failed = {"GPU-0": FAILURE}
        await w.report()
        await w.changed.until("the taint", lambda: bool(w.taints()))
        await w.changed.until("the split", lambda: sum(sizes()) == 70 and max(sizes()) <= 64)


async def test_a_claim_allocated_it_anyway_fails_its_binding_naming_the_failure() -> None:
    """A claim that tolerates the taint (or was allocated it just before) gets
    no attach: ``FabricDeviceFailed`` with the reason, and it stays held out."""
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        await failed_and_detached(w, rec)
        await w.api.delete(f"{CLAIMS}/claim")
        await w.changed.until("the claim gone", lambda: not w.api.objects(CLAIMS))
        again = claim("node-a")
        again["metadata"] |= {"name": "again", "uid": "uid-2"}
        w.api.add(CLAIMS, again)
        await w.changed.until("the failure", lambda: condition(w, FAILED_CONDITION))
        (stored,) = w.api.objects(CLAIMS)
        (entry,) = stored["status"]["devices"]
        (said,) = [c["message"] for c in entry["conditions"] if c["type"] == FAILED_CONDITION]
        assert "failed on a node (xid-79)" in said, said
        assert [t["effect"] for t in w.taints()] == ["NoSchedule"]
    assert [a for a in w.fabric.attached if a[0] == "gpu-0"] == [("gpu-0", "node-a", "adapter0")]


async def test_a_warm_spare_that_fails_is_detached_and_held_out() -> None:
    w = Failing()
    spares = settings(fabric_pool_shape="per-domain", spares_fixed=f"gpu:{MODEL}=1",
                      spares_cap=0.5)  # fmt: skip
    rec = Reconciler(w.api, w.fabric, spares)
    async with running(rec):
        await w.changed.until("a spare", lambda: len(w.fabric.attached) == 1)
        ((spare, _, _),) = w.fabric.attached
        uuid = w.fabric.devices[spare].uuid
        await w.changed.until("ready", lambda: bool(rec.spares.last.keep))
        w.failed = {uuid: FAILURE}
        await w.report()
        await w.changed.until("detached", lambda: w.fabric.detached == [spare])
        name = device_name(uuid)
        await w.changed.until("held out", lambda: [t["effect"] for t in w.taints(name)]
                              == ["NoSchedule"])  # fmt: skip
        # The spare policy attaches a healthy one in its place.
        await w.changed.until("another spare", lambda: [a[0] for a in w.fabric.attached]
                              == [spare, "gpu-1" if spare == "gpu-0" else "gpu-0"])  # fmt: skip


async def test_cured_on_its_node_before_the_detach_it_stays_and_is_untainted() -> None:
    """The node reset it and its check passed while a claim still held it: the
    node's report names it failed no more, and the controller follows."""
    w = Failing()
    rec = Reconciler(w.api, w.fabric, per_domain())
    async with running(rec):
        w.api.add(CLAIMS, claim("node-a"))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        w.busy, w.failed = {"GPU-0"}, {"GPU-0": FAILURE}
        await w.report()
        await w.changed.until("the taint", lambda: bool(w.taints()))
        w.failed = {}
        await w.report()
        await w.changed.until("untainted", lambda: w.taints() == [])
        assert "gpu-0" not in rec.failures and w.fabric.detached == []


async def test_a_restart_while_it_is_attached_learns_its_node_again() -> None:
    w = Failing()
    async with running(Reconciler(w.api, w.fabric, per_domain())):
        w.api.add(CLAIMS, claim("node-a"))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        w.busy, w.failed = {"GPU-0"}, {"GPU-0": FAILURE}
        await w.report()
        await w.changed.until("the taint", lambda: bool(w.taints()))
    again = Reconciler(w.api, w.fabric, per_domain())
    async with running(again):
        await w.changed.until("the first pass", lambda: again.published != {})
        await again.publisher.in_sync.wait()
        again.reconcile()
        assert again.failures.by_node() == {"node-a": {"gpu-0"}}
        assert [t["effect"] for t in w.taints()] == ["NoExecute"]
