"""The lease keeper on the shipped in-memory API, with an injected wall and
monotonic clock (no sleeps): it stamps a claim when it is allocated (the
holder of a template claim from its owner Pod), warns the claim and its
pods, expires the lease once (a standalone claim deleted, its pods evicted
with the policy's grace period), reports and retries an eviction a budget
refuses, and a second keeper (a restart, a new leader) neither resets nor
repeats anything (issue 37)."""

from __future__ import annotations

import pytest

from driver.kube.api import claim_path
from driver.kube.events import EVENTS_V1
from driver.leaseterms import (
    DURATION,
    EXPIRED,
    EXPIRY,
    EXTEND_BY,
    EXTEND_ID,
    EXTEND_REASON,
    EXTEND_REQUESTER,
    EXTENDED,
    EXTENDED_ID,
    HOLDER,
    HOLDER_POD,
    PHASE,
    START,
    WARNED,
    stamp,
)
from driver.metrics import CONTROLLER as REGISTRY
from tests.unit.lease_world import CLAIMS, NS, PODS, T0, World, claim, metric, world

__all__ = ["world"]  # the fixture


async def test_a_lease_is_stamped_at_allocation_warned_and_expired_once(world: World) -> None:
    await world.api.create(CLAIMS, claim("c", **{DURATION: "2h"}))
    keeper = await world.keeper()
    await world.caught_up(keeper)
    assert await keeper.tick() is None  # not allocated: no clock yet
    assert START not in world.notes("c")
    await world.allocate("c", ("p1", "p2"), at=T0 - 60)  # the controller sees it a minute late
    await world.caught_up(keeper)
    await keeper.tick()
    notes = world.notes("c")
    assert (notes[START], notes[EXPIRY]) == (stamp(T0 - 60), stamp(T0 - 60 + 7200))
    await world.caught_up(keeper)
    wait = await keeper.tick()
    assert wait == pytest.approx(7200 - 60 - 600)  # until the warning
    world.now = T0 - 60 + 7200 - 600
    await keeper.tick()
    assert world.notes("c")[PHASE] == WARNED
    # A restarted controller (or a new leader) neither restamps nor warns again.
    world.now += 30
    second = await world.keeper()
    await world.caught_up(second)
    assert await second.tick() == pytest.approx(570)
    assert world.notes("c")[START] == stamp(T0 - 60)
    assert metric("patchbay_device_leases", state="expiring") >= 1
    evicted = metric("patchbay_device_lease_evictions_total", cause="expiry")
    world.now = T0 - 60 + 7200
    await second.tick()
    assert world.pods() == []  # both evicted, with the policy's grace period
    assert [e["deleteOptions"]["gracePeriodSeconds"] for e in world.api.evictions] == [7, 7]
    assert all(e["deleteOptions"]["preconditions"]["uid"] for e in world.api.evictions)
    assert metric("patchbay_device_lease_evictions_total", cause="expiry") == evicted + 2
    # The standalone claim is deleted (MemoryKube has no finalizer: gone at once).
    assert world.api.objects(CLAIMS) == []
    assert await world.events() == [
        ("ResourceClaim", "c", "LeaseStarted"),
        ("ResourceClaim", "c", "LeaseExpiring"), ("Pod", "p1", "LeaseExpiring"),
        ("Pod", "p2", "LeaseExpiring"),
        ("ResourceClaim", "c", "LeaseExpired"), ("Pod", "p1", "LeaseExpired"),
        ("Pod", "p2", "LeaseExpired"),
    ]  # fmt: skip
    evictions = [path for method, path in world.api.requests if path.endswith("/eviction")]
    assert evictions == [f"{PODS}/p1/eviction", f"{PODS}/p2/eviction"]
    # The first keeper, working from its old view, repeats nothing.
    await keeper.tick()
    assert [p for _, p in world.api.requests if p.endswith("/eviction")] == evictions


async def test_a_template_claim_takes_its_holder_from_its_pod_and_is_not_deleted(
    world: World,
) -> None:
    await world.api.create(PODS, {"metadata": {"name": "nb-0", "annotations": {HOLDER: "bob"}}})
    made = claim("nb-0-gpu", owner="nb-0", **{HOLDER_POD: "nb-0"})
    made["metadata"]["annotations"][HOLDER] = "system:serviceaccount:kube-system:x"
    await world.api.create(CLAIMS, made)
    keeper = await world.keeper()
    await world.allocate("nb-0-gpu", ("nb-0",), at=None)  # no allocationTimestamp: our clock
    await world.caught_up(keeper)
    await keeper.tick()
    notes = world.notes("nb-0-gpu")
    assert notes[HOLDER] == "bob"
    assert (notes[START], notes[EXPIRY]) == (stamp(T0), stamp(T0 + 3600))  # the policy's default
    world.now = T0 + 3600
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.pods() == []
    assert [c["metadata"]["name"] for c in world.api.objects(CLAIMS)] == ["nb-0-gpu"]
    assert world.api.requests.count(("DELETE", claim_path(NS, "nb-0-gpu"))) == 0


async def test_an_eviction_a_budget_refuses_is_reported_and_retried(world: World) -> None:
    await world.api.create(CLAIMS, claim("c", owner="p", **{DURATION: "1h"}))
    keeper = await world.keeper()
    await world.allocate("c", ("p",))
    await world.caught_up(keeper)
    await keeper.tick()
    world.api.fail("POST", f"{PODS}/p/eviction", 429, times=2)
    blocked = metric("patchbay_device_lease_evictions_blocked_total")
    world.now = T0 + 3600
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.pods() == ["p"] and world.notes("c")[PHASE] == EXPIRED
    assert metric("patchbay_device_lease_evictions_blocked_total") == blocked + 1
    await world.caught_up(keeper)
    wait = await keeper.tick()  # not before the backoff's time
    assert wait is not None and wait > 0 and world.pods() == ["p"]
    world.mono += wait
    await keeper.tick()  # refused again: a longer wait
    assert metric("patchbay_device_lease_evictions_blocked_total") == blocked + 2
    world.mono += 3600
    await keeper.tick()
    assert world.pods() == []
    assert ("Pod", "p", "LeaseEvictionBlocked") in await world.events()
    assert ("ResourceClaim", "c", "LeaseEvictionBlocked") in await world.events()


async def test_claims_without_a_lease_are_left_alone(world: World) -> None:
    other = claim("mig")
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "mig.patchbay.dev"
    await world.api.create(CLAIMS, other)
    keeper = await world.keeper()
    await world.allocate("mig", ("p",))
    await world.caught_up(keeper)
    assert await keeper.tick() is None
    assert START not in world.notes("mig") and world.pods() == ["p"]


async def test_an_extension_moves_the_expiry_names_who_and_is_capped(world: World) -> None:
    await world.api.create(CLAIMS, claim("c", **{DURATION: "1h"}))
    keeper = await world.keeper()
    await world.allocate("c", ("p",))
    await world.caught_up(keeper)
    await keeper.tick()
    world.now = T0 + 3000  # warned
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.notes("c")[PHASE] == WARNED

    async def ask(by: str, request: str, who: str = "alice") -> None:
        ask = {EXTEND_BY: by, EXTEND_REASON: "run 7 needs it", EXTEND_ID: request,
               EXTEND_REQUESTER: who}  # fmt: skip
        await world.api.merge_patch(f"{CLAIMS}/c", {"metadata": {"annotations": ask}})
        await world.caught_up(keeper)
        await keeper.tick()

    await ask("2h", "r1")
    notes = world.notes("c")
    assert (notes[EXPIRY], notes[EXTENDED], notes[EXTENDED_ID]) == (
        stamp(T0 + 3 * 3600),
        "2h",
        "r1",
    )
    assert PHASE not in notes  # warned again before the new end
    await ask(
        "2h", "r2", "bob"
    )  # 4h in all: over the 3h cap (the admission's miss, or a policy changed)
    notes = world.notes("c")
    assert (notes[EXPIRY], notes[EXTENDED_ID]) == (stamp(T0 + 3 * 3600), "r2")
    events = await world.events()
    assert events[-2:] == [("ResourceClaim", "c", "LeaseExtended"),
                           ("ResourceClaim", "c", "LeaseExtensionRefused")]  # fmt: skip
    await world.recorder.drain()
    notes_of = [e["note"] for e in world.api.objects(f"{EVENTS_V1}/namespaces/{NS}/events")
                if e["reason"].startswith("LeaseExten")]  # fmt: skip
    assert "alice extended the lease by 2h (2h in all): run 7 needs it" in notes_of[0]
    assert "asked by bob refused: 4h in all passes the cap 3h" in notes_of[1]
    world.now = T0 + 3 * 3600  # the extended end
    await world.caught_up(keeper)
    await keeper.tick()
    assert world.pods() == []


async def test_seconds_to_expiry_follow_the_stamp_until_the_lease_ends(world: World) -> None:
    def left() -> float | None:
        labels = {"claim_namespace": NS, "claim": "to-expiry"}
        return REGISTRY.get_sample_value("patchbay_device_lease_seconds_to_expiry", labels)

    await world.api.create(CLAIMS, claim("to-expiry", **{DURATION: "2h"}))
    keeper = await world.keeper()
    await world.caught_up(keeper)
    assert left() is None  # not allocated: no clock, no sample
    await world.allocate("to-expiry", ("p1",), at=T0 - 60)
    await world.caught_up(keeper)
    await keeper.tick()
    await world.caught_up(keeper)
    assert left() == pytest.approx(7200 - 60)
    world.now = T0 - 60 + 7200 - 600  # warned: still running
    await keeper.tick()
    await world.caught_up(keeper)
    assert world.notes("to-expiry")[PHASE] == WARNED
    assert left() == pytest.approx(600)
    world.now += 700  # expired: evicted and deleted, no longer a running lease
    await keeper.tick()
    await world.caught_up(keeper)
    assert left() is None
