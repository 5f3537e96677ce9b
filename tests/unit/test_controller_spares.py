"""The warm-spare policy (``driver.controller.spares.policy``) over fake pool states."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from driver.controller.pool.devices import build_pool
from driver.controller.pool.layout import mark_spares
from driver.controller.spares.policy import Free, Spare, SpareRules, parse_counts, plan
from driver.controller.spares.settings import SpareSettings
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricInventory
from driver.inspect.fabric import fabric_view, render_fabric
from tests.unit.fabric_objects import reachable_gpu as gpu
from tests.unit.inspect_objects import DEVICES, fabric_slices, node, variant_name

H100 = "H100"
NODES = ("node-a", "node-b")


def free(dev: str, nodes: tuple[str, ...] = NODES, model: str = H100) -> Free:
    return Free(dev, "gpu", model, tuple((n, "adapter0") for n in nodes))


def spare(dev: str, node: str, since: float = 0.0, ready: bool = True, **kw: Any) -> Spare:
    return Spare(dev, "gpu", H100, node, "adapter0", ready, since, **kw)


FIXED = SpareRules(fixed={("gpu", H100): 1}, cap=1.0, idle_timeout=60)
DEMAND = SpareRules(demand={("gpu", "*"): 2}, window=300, cap=1.0, idle_timeout=60)


def test_counts_parse_and_bad_entries_name_the_setting() -> None:
    assert parse_counts("gpu:H100 SXM=1, nvme:PM1733=2", "x") == {
        ("gpu", "H100 SXM"): 1,
        ("nvme", "PM1733"): 2,
    }
    for bad, what in (("gpu=1", "kind:model=N"), ("tpu:X=1", "kind 'tpu'"), ("gpu:*=1", "'*'")):
        with pytest.raises(ValueError, match=what):
            parse_counts(bad, "spares_fixed")
    assert parse_counts("gpu:*=1", "spares_demand", wildcard=True) == {("gpu", "*"): 1}
    with pytest.raises(ValidationError, match="spares_fixed"):
        SpareSettings(spares_fixed="gpu:H100")
    rules = SpareSettings(spares_fixed="gpu:H100=1", spares_cap=0.5).spare_rules()
    assert rules.fixed == {("gpu", H100): 1} and rules.cap == 0.5 and rules.enabled


def test_no_policy_attaches_nothing_and_keeps_nothing() -> None:
    p = plan(SpareRules(), [spare("gpu-0", "node-a")], [free("gpu-1")], 4, NODES, {}, 0.0)
    assert p.attach == () and p.keep == ()
    assert [r.why for r in p.retire] == ["not wanted"]


def test_fixed_spares_one_per_node_from_the_least_reachable_devices() -> None:
    frees = [free("gpu-0"), free("gpu-1", ("node-a",)), free("gpu-2", ("node-b",))]
    p = plan(FIXED, [], frees, 4, NODES, {}, 0.0)
    assert sorted(p.attach) == [("gpu-1", "node-a", "adapter0"), ("gpu-2", "node-b", "adapter0")]


def test_a_spare_found_attached_is_kept_not_attached_again() -> None:
    """A restart: the attached spare is adopted, only node-b gets a new one."""
    p = plan(FIXED, [spare("gpu-0", "node-a", 5.0)], [free("gpu-1")], 4, NODES, {}, 10.0)
    assert [s.device_id for s in p.keep] == ["gpu-0"]
    assert p.attach == (("gpu-1", "node-b", "adapter0"),) and p.retire == ()


def test_a_taken_spare_is_replaced() -> None:
    """The pod's allocation took gpu-0 (no longer a spare): another one comes."""
    p = plan(FIXED, [], [free("gpu-1", ("node-a",))], 4, ("node-a",), {}, 0.0)
    assert p.attach == (("gpu-1", "node-a", "adapter0"),)


def test_demand_spares_follow_an_allocation_for_the_window() -> None:
    frees = [free(f"gpu-{i}") for i in range(4)]
    demand = {("node-a", "gpu", H100): 100.0}
    p = plan(DEMAND, [], frees, 8, NODES, demand, 150.0)
    assert [(d, n) for d, n, _ in p.attach] == [("gpu-0", "node-a"), ("gpu-1", "node-a")]
    assert p.wake_at == 400.0  # the window's end
    later = plan(DEMAND, [], frees, 8, NODES, demand, 401.0)
    assert later.attach == ()


def test_an_idle_spare_above_the_floor_goes_and_closes_the_window() -> None:
    rules = SpareRules(
        fixed={("gpu", H100): 1}, demand={("gpu", H100): 2}, window=600, cap=1.0, idle_timeout=60
    )
    spares = [spare("gpu-0", "node-a", 10.0), spare("gpu-1", "node-a", 20.0)]
    demand = {("node-a", "gpu", H100): 0.0}
    before = plan(rules, spares, [free("gpu-2")], 8, ("node-a",), demand, 79.0)
    assert len(before.keep) == 2 and before.retire == () and before.wake_at == 70.0
    p = plan(rules, spares, [free("gpu-2")], 8, ("node-a",), demand, 80.0)
    assert [s.device_id for s in p.keep] == ["gpu-0"]  # the fixed floor stays
    assert [(r.spare.device_id, r.why) for r in p.retire] == [("gpu-1", "idle")]
    assert p.closed == {("node-a", "gpu", H100)} and p.attach == ()  # not replaced


def test_a_fixed_spare_never_times_out() -> None:
    p = plan(FIXED, [spare("gpu-0", "node-a", 0.0)], [], 4, ("node-a",), {}, 10_000.0)
    assert [s.device_id for s in p.keep] == ["gpu-0"] and p.retire == ()


def test_the_cap_is_never_exceeded() -> None:
    rules = SpareRules(fixed={("gpu", H100): 2}, cap=0.25)
    frees = [free(f"gpu-{i}") for i in range(8)]
    p = plan(rules, [], frees, 8, NODES, {}, 0.0)  # wants 4, the cap allows 2 of 8
    assert len(p.attach) == 2
    spares = [spare(f"gpu-{i}", NODES[i % 2], float(i)) for i in range(3)]
    p = plan(rules, spares, frees[3:], 8, NODES, {}, 5.0)  # a cap lowered: the newest goes
    assert [s.device_id for s in p.keep] == ["gpu-0", "gpu-1"] and p.attach == ()
    assert [(r.spare.device_id, r.why) for r in p.retire] == [("gpu-2", "over the cap")]


def test_unhealthy_and_surplus_spares_go() -> None:
    spares = [spare("gpu-0", "node-a", healthy=False), spare("gpu-1", "node-a", 1.0)]
    spares.append(spare("gpu-2", "node-a", 2.0))
    p = plan(FIXED, spares, [], 8, ("node-a",), {}, 3.0)
    assert [s.device_id for s in p.keep] == ["gpu-1"]
    assert [(r.spare.device_id, r.why) for r in p.retire] == [
        ("gpu-0", "unhealthy"),
        ("gpu-2", "not wanted"),
    ]


def test_models_do_not_mix() -> None:
    p = plan(FIXED, [], [free("gpu-0", model="A100")], 4, NODES, {}, 0.0)
    assert p.attach == ()


def test_a_spare_variant_has_no_binding_conditions_and_the_same_counter() -> None:
    inv = FabricInventory((gpu("gpu-0", NODES),), ())
    reports = {n: NodeFabric({"adapter0": "pci0000:15"}) for n in NODES}
    spec, variants = build_pool("fabric", inv, reports, (), ())
    on_a = next(n for n, v in variants.items() if v.node == "node-a")
    marked = {d.name: d for d in mark_spares(spec, {on_a}).devices}
    for name, d in marked.items():
        is_spare = name == on_a
        assert d.attributes["spare"] is is_spare
        assert bool(d.binding_conditions) is not is_spare
        assert d.consumes_counters == spec.devices[0].consumes_counters


def test_kubectl_patchbay_fabric_shows_a_spare() -> None:
    slices = fabric_slices(offered=("gpu-0", "gpu-1"))
    for s in slices:  # gpu-0's variant on node-a is published as a spare
        for d in s["spec"].get("devices") or ():
            if d["name"] == variant_name("gpu-0", "node-a", DEVICES["gpu-0"][2]):
                d["attributes"]["spare"] = {"bool": True}
                d.pop("bindingConditions", None)
    nodes = [node("node-a", {"GPU-f0": "adapter0"}), node("node-b")]
    view = fabric_view(slices, [], nodes, [], datetime(2026, 12, 1, tzinfo=UTC))
    devs = {d["device"]: d for d in view["devices"]}
    assert devs["gpu-0"]["state"] == "spare" and devs["gpu-0"]["spare"]["node"] == "node-a"
    assert devs["gpu-1"]["state"] == "free" and devs["gpu-1"]["spare"] is None
    assert "spare on node-a" in render_fabric(view)


def test_a_restart_keeps_what_it_found_and_adds_nothing() -> None:
    """Demand 2 per node, no allocation seen since the restart: the one spare
    found stays (carried), no second one comes; idle, it still goes."""
    found = {("node-a", "gpu", H100): 1}
    spares = [spare("gpu-0", "node-a", 0.0)]
    p = plan(DEMAND, spares, [free("gpu-1")], 8, NODES, {}, 10.0, found)
    assert [s.device_id for s in p.keep] == ["gpu-0"] and p.attach == ()
    later = plan(DEMAND, spares, [free("gpu-1")], 8, NODES, {}, 61.0, found)
    assert [(r.spare.device_id, r.why) for r in later.retire] == [("gpu-0", "idle")]
    assert plan(DEMAND, spares, [], 8, NODES, {}, 10.0).keep == ()  # not carried: not wanted
