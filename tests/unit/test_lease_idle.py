"""Idle devices under a DeviceLeasePolicy (issue 37): the node's ``Idle``
report read back (its threshold and since when), the rules due from it, and
the keeper on the in-memory API with injected clocks: ``Event`` warns the
claim and its pods once per idle stretch, ``Reclaim`` evicts as expiry does
(the claim marked first, the budget honoured), a busy device keeps its
claim, audit mode evicts nothing and says what it would do, and a rule
stricter than the node's threshold is told on the policy."""

from __future__ import annotations

from typing import Any

from driver.controller.leases.idle import WOULD_RECLAIM, idle_due, unprovable
from driver.controller.leases.policies import (
    EVENT,
    POLICIES_PATH,
    RECLAIM,
    IdleRule,
    parse_policy,
    terms_for,
)
from driver.idleterms import BUSY, IDLE, idle_message, idle_reports, report_of
from driver.kube.events import EVENTS_V1
from driver.leaseterms import (
    AUDIT_EXPIRED,
    DURATION,
    IDLE_NOTED,
    PHASE,
    RECLAIMED,
    lease_of,
    stamp,
)
from tests.unit.lease_world import CLAIMS, NS, PODS, T0, World, claim, metric, world

__all__ = ["world"]  # the fixture

MIN = 60.0


def idle(since: float, threshold: float = 5.0) -> dict[str, Any]:
    """An ``Idle=True`` as the node plugin writes it, one window (60 s) after ``since``."""
    return {"type": IDLE, "status": "True", "reason": "BelowThreshold",
            "message": idle_message(threshold, 60, stamp(since), 2.0),
            "lastTransitionTime": stamp(since + 60)}  # fmt: skip


def busy(at: float) -> dict[str, Any]:
    message = "utilization 80% (threshold 5%)"
    return {"type": IDLE, "status": "False", "reason": BUSY, "message": message,
            "lastTransitionTime": stamp(at)}  # fmt: skip


def allocated(conds: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    results = [{"request": "g", "driver": "patchbay.dev", "pool": "node-a", "device": d}
               for d in conds]  # fmt: skip
    entries = [{"driver": "patchbay.dev", "pool": "node-a", "device": d,
                "conditions": [c] if c else []} for d, c in conds.items()]  # fmt: skip
    out = claim("c")
    out["metadata"].update(namespace=NS, uid="u1")
    out["status"] = {"allocation": {"devices": {"results": results}}, "devices": entries}
    return out


def idle_policy(action: str, length: str = "10m", below: int = 10, **spec: Any) -> dict[str, Any]:
    rule = {"utilizationBelowPercent": below, "for": length, "action": action}
    return {"metadata": {"name": f"idle-{action.lower()}"},
            "spec": {"deviceClassNames": ["gpu.patchbay.dev"], **spec, "idle": rule}}  # fmt: skip


def test_the_nodes_report_reads_back_its_threshold_and_since_when() -> None:
    report = report_of("node-a/gpu-0", idle(T0))
    assert report is not None and (report.threshold, report.since) == (5.0, T0)
    assert report_of("node-a/gpu-0", busy(T0)) is None
    # Not our message: the report's own time, threshold unknown.
    other = report_of("d", {**idle(T0), "message": "quiet"})
    assert other is not None and (other.threshold, other.since) == (None, T0 + 60)
    both = idle_reports(allocated({"gpu-0": idle(T0), "gpu-1": idle(T0 + 5)}))
    assert [r.since for r in both or ()] == [T0, T0 + 5]
    # One device busy, unreported (no source) or none of ours: the claim is not idle.
    assert idle_reports(allocated({"gpu-0": idle(T0), "gpu-1": busy(T0)})) is None
    assert idle_reports(allocated({"gpu-0": idle(T0), "gpu-1": None})) is None
    assert idle_reports(allocated({})) is None


def test_rules_fall_due_from_the_last_device_to_go_low_strongest_first() -> None:
    c = allocated({"gpu-0": idle(T0), "gpu-1": idle(T0 + MIN)})
    event = IdleRule("a", 10, 10 * MIN, EVENT)
    reclaim = IdleRule("b", 10, 30 * MIN, RECLAIM)
    lease = lease_of(c)
    assert idle_due(c, lease, (event, reclaim), T0 + 10 * MIN) == (None, T0 + 11 * MIN)
    step, nxt = idle_due(c, lease, (event, reclaim), T0 + 11 * MIN)
    assert step is not None and step.action == EVENT and nxt == T0 + 31 * MIN
    noted = lease_of({"metadata": {"annotations": {IDLE_NOTED: step.noted}}})
    assert idle_due(c, noted, (event, reclaim), T0 + 20 * MIN)[0] is None  # told once
    step, _ = idle_due(c, noted, (event, reclaim), T0 + 31 * MIN)
    assert step is not None and step.action == RECLAIM
    audit = IdleRule("b", 10, 30 * MIN, RECLAIM, audit=True)
    step, _ = idle_due(c, noted, (event, audit), T0 + 31 * MIN)
    assert step is not None and step.action == WOULD_RECLAIM
    # A rule asking for less than the node's 5 % cannot be shown: never due, told.
    strict = IdleRule("s", 3, MIN, RECLAIM)
    assert idle_due(c, lease, (strict,), T0 + 99 * MIN) == (None, None)
    assert unprovable(c, (strict, event)) == (5.0, [strict])


async def idle_world(
    world: World, policy: dict[str, Any], pods: tuple[str, ...] = ("p",), owner: str = ""
) -> Any:
    await world.api.create(POLICIES_PATH, policy)
    await world.api.create(CLAIMS, claim("c", owner, **{DURATION: "8h"}))
    keeper = await world.keeper()
    await world.allocate("c", pods, devices=("gpu-0", "gpu-1"))
    await world.caught_up(keeper)
    await keeper.tick()  # the lease starts
    return keeper


async def reasons(world: World) -> list[tuple[str, str, str]]:
    return [e for e in await world.events() if e[2] != "LeaseStarted"]


async def notes_of(world: World, reason: str) -> list[str]:
    await world.recorder.drain()
    return [e["note"] for e in world.api.objects(f"{EVENTS_V1}/namespaces/{NS}/events")
            if e["reason"] == reason]  # fmt: skip


async def test_an_idle_claim_under_event_is_warned_once_per_stretch(world: World) -> None:
    keeper = await idle_world(world, idle_policy("Event"), pods=("p1", "p2"))
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": busy(T0)})
    world.now = T0 + 20 * MIN
    await world.caught_up(keeper)
    await keeper.tick()
    assert await reasons(world) == []  # one device busy: not idle
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": idle(T0 + 15 * MIN)})
    await world.caught_up(keeper)
    assert await keeper.tick() == 5 * MIN  # 10m from the later device's stretch
    world.now = T0 + 25 * MIN
    await keeper.tick()
    assert world.notes("c")[IDLE_NOTED] == f"{stamp(T0 + 15 * MIN)} Event"
    assert await reasons(world) == [
        ("ResourceClaim", "c", "DevicesIdle"), ("Pod", "p1", "DevicesIdle"),
        ("Pod", "p2", "DevicesIdle"),
    ]  # fmt: skip
    (note, *_) = await notes_of(world, "DevicesIdle")
    assert (
        "devices node-a/gpu-0, node-a/gpu-1 of alice below 5% (as the node measures) since "
        f"{stamp(T0 + 15 * MIN)} (DeviceLeasePolicy idle-event idle.for 10m"
    ) in note
    # A restarted keeper repeats nothing; the pods keep their devices.
    second = await world.keeper()
    await world.caught_up(second)
    world.now = T0 + 40 * MIN
    await second.tick()
    assert len(await reasons(world)) == 3 and world.pods() == ["p1", "p2"]
    # Busy, then idle again: a new stretch, a new warning.
    await world.mark("c", {"gpu-0": idle(T0 + 50 * MIN), "gpu-1": idle(T0 + 50 * MIN)})
    world.now = T0 + 60 * MIN
    await world.caught_up(second)
    await second.tick()
    assert len(await reasons(world)) == 6


async def test_an_idle_claim_under_reclaim_is_evicted_as_at_expiry(world: World) -> None:
    keeper = await idle_world(
        world, idle_policy("Reclaim", evictionGracePeriodSeconds=3), owner="p"
    )
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": idle(T0)})
    world.api.fail("POST", f"{PODS}/p/eviction", 429, times=1)  # a budget, once
    before = metric("patchbay_device_lease_evictions_total", cause="idle")
    world.now = T0 + 10 * MIN
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.notes("c")[PHASE] == RECLAIMED and world.pods() == ["p"]
    assert await reasons(world) == [
        ("ResourceClaim", "c", "IdleReclaimed"), ("Pod", "p", "IdleReclaimed"),
        ("Pod", "p", "LeaseEvictionBlocked"), ("ResourceClaim", "c", "LeaseEvictionBlocked"),
    ]  # fmt: skip
    (blocked, *_) = await notes_of(world, "LeaseEvictionBlocked")
    assert "for the idle devices of claim c is refused" in blocked
    world.mono += 3600
    await world.caught_up(keeper)
    await keeper.tick()  # retried after the backoff
    assert (
        world.pods() == []
        and metric("patchbay_device_lease_evictions_total", cause="idle") == before + 1
    )
    assert [e["deleteOptions"]["gracePeriodSeconds"] for e in world.api.evictions] == [3, 3]
    (note, *_) = await notes_of(world, "IdleReclaimed")
    assert "evicting 1 pod(s) (grace period 3s); the pod's next claim is a new lease" in note
    assert len(await reasons(world)) == 4  # nothing told twice


async def test_a_reclaimed_standalone_claim_is_deleted(world: World) -> None:
    keeper = await idle_world(world, idle_policy("Reclaim"))
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": idle(T0)})
    world.now = T0 + 10 * MIN
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.pods() == [] and world.api.objects(CLAIMS) == []


async def test_a_busy_device_is_never_reclaimed(world: World) -> None:
    keeper = await idle_world(world, idle_policy("Reclaim"))
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": busy(T0 + 9 * MIN)})
    world.now = T0 + 3 * 3600
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.pods() == ["p"] and PHASE not in world.notes("c") and world.api.evictions == []


async def test_audit_mode_says_what_it_would_evict_and_evicts_nothing(world: World) -> None:
    await world.api.merge_patch(f"{POLICIES_PATH}/notebooks", {"spec": {"audit": True}})
    keeper = await idle_world(world, idle_policy("Reclaim", audit=True))
    would = metric("patchbay_device_lease_would_evict_total", cause="idle")
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": idle(T0)})
    world.now = T0 + 10 * MIN
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.notes("c")[IDLE_NOTED] == f"{stamp(T0)} {WOULD_RECLAIM}"
    assert metric("patchbay_device_lease_would_evict_total", cause="idle") == would + 1
    (note, *_) = await notes_of(world, "LeaseWouldEvict")
    assert "audit only (spec.audit)" in note and "1 pod(s) would be evicted (p)" in note
    # At the lease's end (8h): reported, nothing evicted, and only once.
    world.now = T0 + 8 * 3600
    await world.caught_up(keeper)
    await keeper.tick()
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.notes("c")[PHASE] == AUDIT_EXPIRED
    assert metric("patchbay_device_leases", state="audited") >= 1
    assert world.pods() == ["p"] and world.api.evictions == []
    assert len(world.api.objects(CLAIMS)) == 1
    assert [r for _, _, r in await reasons(world)].count(
        "LeaseWouldEvict"
    ) == 4  # claim, pod; twice


async def test_a_rule_stricter_than_the_nodes_threshold_is_told_on_the_policy(
    world: World,
) -> None:
    keeper = await idle_world(world, idle_policy("Reclaim", below=3))
    await world.mark("c", {"gpu-0": idle(T0), "gpu-1": idle(T0)})
    world.now = T0 + 3 * 3600
    for _ in range(2):
        await world.caught_up(keeper)
        await keeper.tick()
    assert world.pods() == ["p"]
    await world.recorder.drain()
    told = [e for e in world.api.objects(f"{EVENTS_V1}/namespaces/default/events")
            if e["reason"] == "IdleThresholdBelowNode"]  # fmt: skip
    assert len(told) == 1 and told[0]["regarding"]["kind"] == "DeviceLeasePolicy"
    assert (
        "spec.idle.utilizationBelowPercent 3 is below the idle threshold the node "
        "measures against (5%"
    ) in told[0]["note"]


def test_each_policys_idle_rule_applies_and_expiry_audits_only_if_all_do() -> None:
    spec = {"deviceClassNames": ["gpu.patchbay.dev"], "defaultDuration": "1h"}
    reclaim = {"utilizationBelowPercent": 10, "for": "30m", "action": "Reclaim"}
    a = parse_policy({"metadata": {"name": "a"}, "spec": {**spec, "audit": True, "idle": reclaim}})
    event = {"utilizationBelowPercent": 5, "for": "1h"}  # action: Event, the default
    b = parse_policy({"metadata": {"name": "b"}, "spec": {**spec, "idle": event}})
    c = claim("c")
    both = terms_for(c, (a, b), {})
    assert both.idle == (IdleRule("a", 10, 1800, RECLAIM, True), IdleRule("b", 5, 3600, EVENT))
    assert not both.audit and terms_for(c, (a,), {}).audit
