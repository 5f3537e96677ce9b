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
from driver.fabric_devices.holds import held_for
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric, device_name
from driver.fabricclient.model import FabricInventory, HostAdapter
from driver.inspect.claims import claims_view
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


def slices(nodes: list[dict[str, Any]], held: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    devices = [dataclasses.replace(gpu(i), adapters=(A, B)) for i in range(2)]
    devices.append(dataclasses.replace(gpu(2), adapters=(A,)))
    reports = {"node-a": NodeFabric(ROOTS), "node-b": NodeFabric(ROOTS)}
    built = build_domain_pools("fabric", FabricInventory(tuple(devices), (A, B)), reports,
                               nodes, held, {}, {})  # fmt: skip
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
    on_b = {"nodeSelectorTerms": [{"matchFields": [  # the scheduler's, for a device bound to a node
        {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}  # fmt: skip
    allocation = {"devices": {"results": [result]}, "allocationTimestamp": "2026-12-01T10:00:00Z",
                  "nodeSelector": on_b}  # fmt: skip
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
    # The variant names no node: the holder's is the one its allocation is bound to.
    assert g0["holder"]["node"] == "node-b" and g0["holder"]["adapter"] is None
    (row,) = claims_view(slices(nodes), [claim_on_b()], [], NOW)
    assert row["node"] == "node-b", row
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


def attach_failed(at: str, device_id: str = "gpu-1") -> dict[str, Any]:
    """The controller's Warning on a claim whose attach of ``device_id`` failed
    (as core/v1 serves it), its note ending in the hold's words."""
    note = f"attaching {device_id} to node-a via adapter0 failed: slot 3: link training; "
    return {"type": "Warning", "reason": "AttachFailed", "message": note + held_for(device_id, 600),
            "involvedObject": {"kind": "ResourceClaim", "namespace": "team", "name": "doomed"},
            "eventTime": at}  # fmt: skip


def test_a_device_held_after_a_failed_attach_is_listed_withheld_until_its_hold_ends() -> None:
    """Held, gpu-1 is in no domain pool (build_domain_pools leaves it out) and
    has no counter: the Warning that says it is held lists it, withheld with
    its reason and until when; once the hold is over it is not listed."""
    nodes = [node("node-a", NodeFabric(ROOTS)), node("node-b", NodeFabric(ROOTS))]
    stored = slices(nodes, held=("gpu-1",))
    assert "gpu-1" not in view_devices(fabric_view(stored, [], nodes, [], NOW))
    events = [attach_failed("2026-12-01T10:00:30.000000Z")]
    view = fabric_view(stored, [], nodes, events, NOW)
    g1 = view_devices(view)["gpu-1"]
    assert g1["state"] == "withheld" and g1["reachable"] == [] and g1["pool"] is None
    assert g1["hold"] == {"until": "2026-12-01T10:10:30Z", "secondsLeft": 588.0}
    assert g1["why"]["reason"] == "AttachFailed" and "link training" in g1["why"]["message"]
    lines = {ln.split()[0]: ln for ln in render_fabric(view).splitlines() if ln.strip()}
    assert "withheld, 9m48s left" in lines["gpu-1"] and "AttachFailed: attaching gpu-1" in lines[
        "gpu-1"]  # fmt: skip
    json.dumps(view)
    over = [attach_failed("2026-12-01T09:50:00Z")]  # held until 10:00:00, before NOW
    assert "gpu-1" not in view_devices(fabric_view(stored, [], nodes, over, NOW))
    # Published again (the hold over, or the controller restarted): its pool says so.
    back = view_devices(fabric_view(slices(nodes), [], nodes, events, NOW))["gpu-1"]
    assert back["state"] == "free" and back["hold"] is None


def view_devices(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["device"]: d for d in view["devices"]}
