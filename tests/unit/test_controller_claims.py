"""Fabric allocations read from claims, conditions written into status.devices."""

from __future__ import annotations

from typing import Any

from driver.controller import claims as cl


def claim(devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": "v1"},
        {"request": "nic", "driver": "patchbay.dev", "pool": "node-a", "device": "vf-1"},
        {"request": "x", "driver": "other.dev", "pool": "fabric", "device": "v2"},
    ]
    return {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "c", "resourceVersion": "7"},
        "status": {"allocation": {"devices": {"results": results}}, "devices": devices or []},
    }


def test_only_our_fabric_results_count() -> None:
    (a,) = cl.fabric_allocations(claim(), "fabric")
    assert (a.claim_uid, a.device, a.ready, a.failed) == ("u1", "v1", False, False)
    assert cl.fabric_allocations({"metadata": {}, "status": {}}, "fabric") == []


def test_condition_added_then_replaced_keeping_other_entries() -> None:
    other = {"driver": "patchbay.dev", "pool": "node-a", "device": "vf-1", "conditions": []}
    c = claim([other])
    ready = cl.condition("FabricDeviceReady", "Attached", "ok", None)
    devices = cl.devices_with_condition(c, "fabric", "v1", ready, {"uuid": "GPU-1"})
    assert devices[0] == other
    assert devices[1]["conditions"][0]["status"] == "True" and devices[1]["data"] == {
        "uuid": "GPU-1"
    }
    c["status"]["devices"] = devices
    (a,) = cl.fabric_allocations(c, "fabric")
    assert a.ready and not a.failed
    failed = cl.condition("FabricAttachFailed", "AttachFailed", "boom", None)
    again = cl.devices_with_condition(c, "fabric", "v1", failed)
    assert [x["type"] for x in again[1]["conditions"]] == [
        "FabricDeviceReady",
        "FabricAttachFailed",
    ]
    assert len(again) == 2


def test_replaced_or_deallocated_claims_no_longer_hold_the_device() -> None:
    assert cl.is_allocated_with(claim(), "u1", "fabric", "v1")
    assert not cl.is_allocated_with(claim(), "u2", "fabric", "v1")
    gone = claim()
    gone["status"] = {}
    assert not cl.is_allocated_with(gone, "u1", "fabric", "v1")
