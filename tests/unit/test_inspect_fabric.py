"""``kubectl patchbay fabric`` on recorded objects: held, free, withheld and why."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from driver.fabric_devices.naming import FAILED_CONDITION
from driver.inspect.cli import parser, render
from driver.inspect.fabric import fabric_view
from driver.inspect.fetch import Snapshot
from tests.unit.inspect_objects import (
    condition,
    event,
    fabric_claim,
    fabric_slices,
    node,
    variant_name,
)

NOW = datetime(2026, 12, 1, 10, 0, 42, tzinfo=UTC)
BINDING_FAILED = (
    'running PreBind plugin "DynamicResources": device binding failed: claim=c, '
    'reason=AttachFailed, message="injected failure: attach of gpu-1 to node-a failed"'
)


def test_held_attached_free_and_withheld_devices() -> None:
    # gpu-1 failed its attach: the controller offers no variant of it (held),
    # the pool still counts it; the scheduler's event names it.
    slices = fabric_slices(offered=("gpu-0", "nic-0"))
    ready = condition("FabricDeviceReady", "Attached", "ok", "2026-12-01T10:00:02Z")
    claims = [fabric_claim("train", "gpu-0", "node-b", [ready], pod="job")]
    nodes = [node("node-a"), node("node-b", {"GPU-f0": "adapter0"}, busy=("GPU-f0",))]
    events = [
        event("Pod", "p", "FailedScheduling", BINDING_FAILED, lastTimestamp="2026-12-01T09:00:00Z"),
        event(
            "ResourceClaim",
            "c",
            "AttachFailed",
            "gpu-10: task failed",
            lastTimestamp="2026-12-01T09:50:00Z",
        ),
    ]
    view = fabric_view(slices, claims, nodes, events, NOW)
    devs = {d["device"]: d for d in view["devices"]}
    assert list(devs) == ["gpu-0", "gpu-1", "nic-0"]
    g0 = devs["gpu-0"]
    assert g0["state"] == "held" and g0["holder"]["claim"] == "team/train"
    assert g0["holder"]["binding"] == {"state": "ready", "seconds": 2.0}
    assert g0["attached"] == {"node": "node-b", "adapter": "adapter0", "busy": True}
    assert [(r["node"], r["pcieRoot"]) for r in g0["reachable"]] == [
        ("node-a", "pci0000:15"),
        ("node-b", "pci0000:15"),
    ]
    assert devs["nic-0"]["state"] == "free" and devs["nic-0"]["attached"] is None
    g1 = devs["gpu-1"]
    assert g1["state"] == "withheld" and g1["reachable"] == []
    # "gpu-10" in a newer event does not name gpu-1.
    assert g1["why"]["message"] == BINDING_FAILED[BINDING_FAILED.index("device binding") :]
    assert view["adapters"][0] == {
        "node": "node-a",
        "adapter": "adapter0",
        "pcieRoot": "pci0000:15",
    }


def test_an_attached_device_no_claim_holds_shows_why_it_stays() -> None:
    # The host refused gpu-0's detach: still attached, no claim, the controller's
    # DetachFailed is the why; a free device's old error is not its state.
    slices = fabric_slices(offered=("gpu-0", "nic-0"))
    nodes = [node("node-a"), node("node-b", {"GPU-f0": "adapter0"})]
    refused = "detaching fabric device gpu-0 failed (retried): memory of gpu-0 is in use"
    events = [
        event("ResourceClaim", "c", "DetachFailed", refused, lastTimestamp="2026-12-01T10:00:30Z"),
        event(
            "ResourceClaim",
            "d",
            "AttachFailed",
            "nic-0: task failed",
            lastTimestamp="2026-12-01T09:00:00Z",
        ),
    ]
    devs = {d["device"]: d for d in fabric_view(slices, [], nodes, events, NOW)["devices"]}
    g0 = devs["gpu-0"]
    assert g0["attached"] == {"node": "node-b", "adapter": "adapter0", "busy": False}
    assert g0["holder"] is None and g0["why"]["reason"] == "DetachFailed"
    assert g0["why"]["message"] == refused
    assert devs["nic-0"]["attached"] is None and devs["nic-0"]["why"] is None


def test_failed_allocation_of_a_dropped_variant_and_the_table() -> None:
    failed = condition(FAILED_CONDITION, "AttachFailed", "task failed", "2026-12-01T10:00:05Z")
    slices = fabric_slices(offered=("gpu-0", "nic-0"))
    claims = [
        fabric_claim("broken", "gpu-1", "node-a", [failed]),
        fabric_claim("slow", "nic-0", "node-a"),
    ]
    snap = Snapshot(slices, claims, [], [node("node-a")])
    args = parser().parse_args(["fabric", "-o", "json"])
    devs = {d["device"]: d for d in json.loads(render(args, snap, NOW))["devices"]}
    dropped = devs[variant_name("gpu-1", "node-a", "adapter0")]
    assert dropped["state"] == "held" and dropped["why"]["message"] == "task failed"
    assert devs["nic-0"]["holder"]["binding"] == {"state": "attaching", "seconds": 42.0}
    text = render(parser().parse_args(["fabric"]), snap, NOW).splitlines()
    assert text[0].split() == ["DEVICE", "TYPE", "STATE", "ATTACHED", "REACHABLE", "CLAIM", "WHY"]
    (nic,) = [x for x in text if x.startswith("nic-0 ")]
    assert nic.split()[:4] == ["nic-0", "vf", "held,", "attaching"]
    assert "node-a/adapter1,node-b/adapter1" in nic and "team/slow" in nic
    (row,) = [x for x in text if x.startswith("fgpu-1-")]
    assert row.endswith("AttachFailed: task failed")
    assert "NODE     ADAPTER    PCIEROOT" in text
    wide = render(parser().parse_args(["fabric", "-o", "wide"]), snap, NOW).splitlines()
    assert wide[0].split()[2:4] == ["SWITCH", "MODEL"]
    assert [x.split()[2:4] for x in wide if x.startswith("nic-0 ")] == [["sw1", "H100"]]
