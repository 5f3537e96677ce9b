"""``kubectl patchbay fabric`` in the per-domain shape: the reach domains.

The slices are the controller's own (``build_domain_pools`` laid out by
``driver.slices.build``): sw0's gpu-0 and gpu-1 reach node-a and node-b,
gpu-2 only node-a (a pool of its own that cuts node-b out), and node-c
carries the label with no adapter that reaches the domain (cut from every
pool). The view lists each domain pool with the Nodes it offers its
devices to and its devices; a device is reachable from those Nodes, and a
claim allocated one on node-b is its holder.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

from driver.controller.pool.domain_pool import build_domain_pools
from driver.controller.pool.domains import LABEL_PREFIX
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric, device_name
from driver.fabricclient.model import FabricInventory, HostAdapter
from driver.inspect.fabric import fabric_view, render_fabric
from driver.slices.build import build_slices, slice_object
from tests.unit.controller_world import gpu
from tests.unit.inspect_objects import condition

NOW = datetime(2026, 12, 1, 10, 0, 42, tzinfo=UTC)
LABEL = LABEL_PREFIX + "pcie0.sw0"
ROOTS = {"adapter0": "pci0000:15"}
A = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
B = HostAdapter("node-b-a0", "pcie0", "sw0", "node-b", "adapter0")


def node(name: str, report: NodeFabric) -> dict[str, Any]:
    annotations = {NODE_ANNOTATION: report.to_annotation()}
    return {"metadata": {"name": name, "labels": {LABEL: ""}, "annotations": annotations}}


def slices(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    devices = [dataclasses.replace(gpu(i), adapters=(A, B)) for i in range(2)]
    devices.append(dataclasses.replace(gpu(2), adapters=(A,)))
    reports = {"node-a": NodeFabric(ROOTS), "node-b": NodeFabric(ROOTS)}
    built = build_domain_pools("fabric", FabricInventory(tuple(devices), (A, B)), reports,
                               nodes, (), {}, {})  # fmt: skip
    out = []
    assert built.adapters  # the nodes' adapter pools, published beside (pairings)
    for spec in (*built.pools, *built.adapters):
        desired = build_slices(spec)
        out += [slice_object(spec, d, 1, len(desired)) for d in desired]
    return out


def claim_on_b() -> dict[str, Any]:
    name = device_name("GPU-0")
    result = {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric/pcie0.sw0",
              "device": name, "bindingConditions": ["FabricDeviceReady"]}  # fmt: skip
    ready = condition("FabricDeviceReady", "Attached", "ok", "2026-12-01T10:00:02Z")
    entry = {"driver": "patchbay.dev", "pool": "fabric/pcie0.sw0", "device": name,
             "conditions": [ready]}  # fmt: skip
    allocation = {"devices": {"results": [result]}, "allocationTimestamp": "2026-12-01T10:00:00Z"}
    return {"metadata": {"namespace": "team", "name": "train", "uid": "u"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": allocation, "devices": [entry]}}  # fmt: skip


def test_the_view_lists_each_domain_pool_its_nodes_and_its_devices() -> None:
    nodes = [
        node("node-a", NodeFabric(ROOTS)),
        node("node-b", NodeFabric(ROOTS, gpus={"GPU-0": "adapter0"}, busy=frozenset({"GPU-0"}))),
        node("node-c", NodeFabric({})),  # labelled, no adapter that reaches sw0
    ]
    view = fabric_view(slices(nodes), [claim_on_b()], nodes, [], NOW)
    (whole, part) = view["domains"]
    assert whole["pool"] == "fabric/pcie0.sw0" and whole["domain"] == "pcie0.sw0"
    assert whole["label"] == LABEL and whole["cut"] == ["node-c"]
    assert whole["nodes"] == ["node-a", "node-b"] and whole["devices"] == ["gpu-0", "gpu-1"]
    assert part["pool"].startswith("fabric/pcie0.sw0/") and part["domain"] == "pcie0.sw0"
    assert part["nodes"] == ["node-a"] and part["cut"] == ["node-b", "node-c"]
    assert part["devices"] == ["gpu-2"]
    devs = {d["device"]: d for d in view["devices"]}
    assert [r["node"] for r in devs["gpu-2"]["reachable"]] == ["node-a"]
    assert devs["gpu-2"]["state"] == "free" and devs["gpu-2"]["pool"] == part["pool"]
    g0 = devs["gpu-0"]
    assert [(r["node"], r["adapter"]) for r in g0["reachable"]] == [("node-a", None),
                                                                    ("node-b", None)]  # fmt: skip
    assert g0["state"] == "held" and g0["holder"]["claim"] == "team/train"
    assert g0["attached"] == {"node": "node-b", "adapter": "adapter0", "busy": True}
    text = render_fabric(view)
    assert "DOMAIN POOL" in text
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}
    assert lines["fabric/pcie0.sw0"] == ["node-a,node-b", "node-c", "gpu-0,gpu-1"]
    assert lines[part["pool"]] == ["node-a", "node-b,node-c", "gpu-2"]
    assert lines["gpu-2"][:3] == ["gpu", "free", "-"] and lines["gpu-2"][3] == "node-a"
    json.dumps(view)  # -o json


def test_a_failed_device_shows_its_reason_held_out_or_still_held() -> None:
    nodes = [node("node-a", NodeFabric(ROOTS)), node("node-b", NodeFabric(ROOTS))]
    stored = slices(nodes)
    for s in stored:
        for d in s["spec"].get("devices") or ():
            if d["name"] == device_name("GPU-1"):
                taint = {"key": "patchbay.dev/unhealthy", "value": "xid-64"}
                d["taints"] = [taint | {"effect": "NoSchedule", "timeAdded": NOW.isoformat()}]
    view = fabric_view(stored, [], nodes, [], NOW)
    devs = {d["device"]: d for d in view["devices"]}
    assert devs["gpu-1"]["state"] == "failed" and devs["gpu-1"]["failed"]["reason"] == "xid-64"
    assert devs["gpu-0"]["failed"] is None and devs["gpu-0"]["state"] == "free"
    lines = {ln.split()[0]: ln for ln in render_fabric(view).splitlines() if ln.strip()}
    assert "held out, failed xid-64" in lines["gpu-1"], lines["gpu-1"]
