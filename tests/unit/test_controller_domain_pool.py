"""The per-domain fabric pool (issue 34, step 2): each device once, reach kept by labels.

What must hold: every physical device appears once in the cluster's slices,
in the pool of its reach domain; every slice of a pool selects the same
Nodes (the domain's label, minus labelled Nodes its devices' adapters do
not reach), so a pool is complete from every node that matches; a slice
holds at most 128 devices; a Node labelled without reach, or reaching
without the label, is named. Pure functions over the fabric's own shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from driver.controller.pool.domain_pool import build_domain_pools
from driver.controller.pool.domains import LABEL_PREFIX, domain_name, reach_domains
from driver.controller.reconciler import Reconciler
from driver.devices.model import PCIE_ROOT
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    NODE_ANNOTATION,
    READY_CONDITION,
    NodeFabric,
    device_name,
)
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import FabricDevice, FabricInventory, HostAdapter
from driver.kube.api import slice_path
from driver.kube.events import EVENTS_V1
from driver.kube.memory import MemoryKube
from driver.slices.build import build_slices
from tests.signals import Signal
from tests.unit.controller_world import running, settings
from tests.unit.fabric_objects import reachable_gpu

REPORT = NodeFabric({"adapter0": "pci0000:15"})
DOMAIN = "pcie0.sw0"
LABEL = LABEL_PREFIX + DOMAIN


def node(name: str, *labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict.fromkeys(labels, "")}}


def on_switch(d: FabricDevice, switch: str, *nodes: str) -> FabricDevice:
    adapters = tuple(HostAdapter(f"{n}-a1", "pcie0", switch, n, "adapter0") for n in nodes)
    return dataclasses.replace(d, switch=switch, adapters=adapters)


def build(devices: list[FabricDevice], nodes: list[dict[str, Any]], **kw: Any) -> Any:
    reports = {n["metadata"]["name"]: REPORT for n in nodes}
    inv = FabricInventory(tuple(devices), ())
    return build_domain_pools(
        "fabric", inv, kw.get("reports", reports), nodes, kw.get("excluded", ()),
        kw.get("pinned", {}), kw.get("carried", {}),
    )  # fmt: skip


def test_each_device_is_published_once_whatever_the_number_of_nodes() -> None:
    names = [f"node-{i}" for i in range(50)]
    gpus = [reachable_gpu(f"gpu-{i}", tuple(names)) for i in range(3)]
    built = build(gpus, [node(n, LABEL) for n in names])
    assert [p.pool_name for p in built.pools] == [f"fabric/{DOMAIN}"]
    (pool,) = built.pools
    assert [d.name for d in pool.devices] == [device_name(f"GPU-gpu-{i}") for i in range(3)]
    for d in pool.devices:
        assert d.binds_to_node and d.node_name is None and not d.consumes_counters
        assert d.binding_conditions == (READY_CONDITION,)
        assert d.binding_failure_conditions == (FAILED_CONDITION,)
        assert PCIE_ROOT not in d.attributes and "fabricAdapter" not in d.attributes
        assert d.attributes["fabricDomain"] == DOMAIN
    assert pool.node_selection == {
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": LABEL, "operator": "Exists"}]}]}
    }  # fmt: skip


def test_a_big_domain_is_one_pool_of_slices_of_at_most_128_that_select_alike() -> None:
    gpus = [reachable_gpu(f"gpu-{i:03d}", ("node-a",)) for i in range(200)]
    (pool,) = build(gpus, [node("node-a", LABEL)]).pools
    slices = build_slices(pool)
    assert [len(s.spec["devices"]) for s in slices] == [128, 72]
    assert all(s.spec["nodeSelector"] == slices[0].spec["nodeSelector"] for s in slices)


def test_switches_joined_by_no_adapter_are_two_domains_each_its_own_pool() -> None:
    a = on_switch(reachable_gpu("gpu-a", ()), "sw0", "node-a")
    b = on_switch(reachable_gpu("gpu-b", ()), "sw1", "node-b")
    assert [d.name for d in reach_domains(FabricInventory((a, b), ()))] == [
        "pcie0.sw0", "pcie0.sw1",
    ]  # fmt: skip
    nodes = [node("node-a", LABEL_PREFIX + "pcie0.sw0"), node("node-b", LABEL_PREFIX + "pcie0.sw1")]
    built = build([a, b], nodes)
    held = {p.pool_name: [d.attributes["fabricDevice"] for d in p.devices] for p in built.pools}
    assert held == {"fabric/pcie0.sw0": ["gpu-a"], "fabric/pcie0.sw1": ["gpu-b"]}
    assert built.findings == ()
    # One adapter that reaches both switches joins them into one domain.
    both = dataclasses.replace(b, adapters=(*b.adapters, *a.adapters))
    assert len(reach_domains(FabricInventory((a, both), ()))) == 1


def test_a_labelled_node_that_reaches_nothing_is_cut_out_and_named() -> None:
    gpu = reachable_gpu("gpu-0", ("node-a",))
    built = build([gpu], [node("node-a", LABEL), node("node-x", LABEL)])
    (pool,) = built.pools
    term = pool.node_selection["nodeSelector"]["nodeSelectorTerms"][0]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn",
                                    "values": ["node-x"]}]  # fmt: skip
    assert [(f.node, f.labelled) for f in built.findings] == [("node-x", True)]
    assert "node-x" not in built.findings[0].note() and LABEL in built.findings[0].note()


def test_a_node_that_reaches_without_the_label_is_named_and_selected_by_nothing() -> None:
    gpu = reachable_gpu("gpu-0", ("node-a", "node-b"))
    built = build([gpu], [node("node-a", LABEL), node("node-b")])
    assert [(f.node, f.labelled) for f in built.findings] == [("node-b", False)]
    assert (
        "matchFields" not in built.pools[0].node_selection["nodeSelector"]["nodeSelectorTerms"][0]
    )


def test_an_adapter_the_node_does_not_report_is_no_reach() -> None:
    gpu = reachable_gpu("gpu-0", ("node-a", "node-b"))
    nodes = [node("node-a", LABEL), node("node-b", LABEL)]
    built = build([gpu], nodes, reports={"node-a": REPORT, "node-b": NodeFabric({})})
    assert [(f.node, f.labelled) for f in built.findings] == [("node-b", True)]


def test_a_device_only_one_node_reaches_is_in_a_pool_that_cuts_the_others() -> None:
    shared = reachable_gpu("gpu-0", ("node-a", "node-b"))
    only_a = reachable_gpu("gpu-1", ("node-a",))
    built = build([shared, only_a], [node("node-a", LABEL), node("node-b", LABEL)])
    by_pool = {p.pool_name: p for p in built.pools}
    assert len(by_pool) == 2 and built.findings == ()
    whole = by_pool.pop(f"fabric/{DOMAIN}")
    ((cut_name, cut),) = by_pool.items()
    assert cut_name.startswith(f"fabric/{DOMAIN}/")
    assert [d.attributes["fabricDevice"] for d in whole.devices] == ["gpu-0"]
    assert [d.attributes["fabricDevice"] for d in cut.devices] == ["gpu-1"]
    term = cut.node_selection["nodeSelector"]["nodeSelectorTerms"][0]
    assert term["matchFields"][0]["values"] == ["node-b"]


def test_an_allocated_device_stays_in_the_pool_it_was_allocated_from() -> None:
    gpu = reachable_gpu("gpu-0", ("node-a", "node-b"))
    name = device_name("GPU-gpu-0")
    first = build([gpu], [node("node-a", LABEL), node("node-b", LABEL)])
    (pool,) = first.pools
    carried = {d.name: d for d in pool.devices}
    # node-b loses its adapter: the device's place would move to a cut pool,
    # but its allocation names the old one, where it stays (and nowhere else).
    only_a = dataclasses.replace(gpu, adapters=gpu.adapters[:1])
    nodes = [node("node-a", LABEL), node("node-b", LABEL)]
    later = build([only_a], nodes, pinned={name: pool.pool_name}, carried=carried)
    assert [(p.pool_name, [d.name for d in p.devices]) for p in later.pools] == [
        (pool.pool_name, [name])
    ]
    # Gone from the inventory, it is still published from what was.
    gone = build([], nodes, pinned={name: pool.pool_name}, carried=carried)
    assert [(p.pool_name, [d.name for d in p.devices]) for p in gone.pools] == [
        (pool.pool_name, [name])
    ]
    assert name in gone.variants and gone.variants[name].device_id == "gpu-0"
    # Not allocated: gone with the inventory; held after a failed attach: out.
    assert build([], nodes).pools == ()
    assert build([gpu], nodes, excluded={"gpu-0"}).pools == ()


def test_domain_names_are_dns_names_of_at_most_63_and_distinct() -> None:
    assert domain_name("pcie0", "sw0") == "pcie0.sw0"
    assert domain_name("Fabric_1", "Switch A") == "fabric-1.switch-a"
    long = domain_name("f" * 60, "s" * 10)
    assert len(long) <= 63 and long.startswith("d-")
    assert domain_name("pcie0", "sw0", taken=["pcie0.sw0"]) == "pcie0.sw0-2"


def labelled_node(name: str, *labels: str) -> dict[str, Any]:
    """A Node as provisioning labels it, with its plugin's report."""
    ann = {NODE_ANNOTATION: REPORT.to_annotation()}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "annotations": ann,
                         "labels": dict.fromkeys(labels, "")}}  # fmt: skip


def stored_pools(api: MemoryKube) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in api.objects(slice_path()):
        devices = [d["name"] for d in s["spec"].get("devices") or ()]
        out.setdefault(s["spec"]["pool"]["name"], []).extend(devices)
    return out


async def test_the_controller_publishes_domain_pools_names_bad_labels_and_leaves_nothing() -> None:
    api, changed = MemoryKube(), Signal()
    api.on_store = lambda _path, _obj: changed.changed()
    api.add("/api/v1/nodes", labelled_node("node-a", LABEL))
    api.add("/api/v1/nodes", labelled_node("node-x", LABEL))  # labelled, reaches nothing
    fabric = MemoryFabric([reachable_gpu("gpu-0", ("node-a",))])
    events = f"{EVENTS_V1}/namespaces/default/events"
    async with running(Reconciler(api, fabric, settings(fabric_pool_shape="per-domain"))):
        await changed.until("the domain pool", lambda: stored_pools(api) != {})
        await changed.until("the Event", lambda: api.objects(events) != [])
    assert stored_pools(api) == {
        f"fabric/{DOMAIN}": [device_name("GPU-gpu-0")],
        "fabric/adapters/node-a": ["adapter-adapter0"],  # its adapter, for pairings
    }
    (stored,) = [
        s
        for s in api.objects(slice_path())
        if s["spec"]["pool"]["name"] != "fabric/adapters/node-a"
    ]
    term = stored["spec"]["nodeSelector"]["nodeSelectorTerms"][0]
    assert term["matchFields"][0]["values"] == ["node-x"] and "nodeName" not in stored["spec"]
    (event,) = api.objects(events)
    assert (event["regarding"]["name"], event["type"]) == ("node-x", "Warning")
    assert event["reason"] == "FabricReachLabelWithoutReach" and LABEL in event["note"]
    # Back to the per-node shape: its pool is published, the domain pool withdrawn.
    async with running(Reconciler(api, fabric, settings(fabric_pool_shape="per-node"))):
        await changed.until(
            "the per-node pool alone", lambda: list(stored_pools(api)) == ["fabric"]
        )
