"""Fabric allocations read from claims, conditions written into status.devices.

Upgrades: an allocation made from an older controller's pool lists the
legacy failure condition; it is read as failed and is the name written.
"""

from __future__ import annotations

from typing import Any

from driver.controller import claims as cl
from driver.fabric_devices.naming import FAILED_CONDITION, LEGACY_FAILED_CONDITION, READY_CONDITION


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
    ready = cl.condition(READY_CONDITION, "Attached", "ok", None)
    devices = cl.devices_with_condition(c, "fabric", "v1", ready, {"uuid": "GPU-1"})
    assert devices[0] == other
    assert devices[1]["conditions"][0]["status"] == "True" and devices[1]["data"] == {
        "uuid": "GPU-1"
    }
    c["status"]["devices"] = devices
    (a,) = cl.fabric_allocations(c, "fabric")
    assert a.ready and not a.failed
    failed = cl.condition(FAILED_CONDITION, "AttachFailed", "boom", None)
    again = cl.devices_with_condition(c, "fabric", "v1", failed)
    assert [x["type"] for x in again[1]["conditions"]] == [READY_CONDITION, FAILED_CONDITION]
    assert len(again) == 2


def test_replaced_or_deallocated_claims_no_longer_hold_the_device() -> None:
    assert cl.is_allocated_with(claim(), "u1", "fabric", "v1")
    assert not cl.is_allocated_with(claim(), "u2", "fabric", "v1")
    gone = claim()
    gone["status"] = {}
    assert not cl.is_allocated_with(gone, "u1", "fabric", "v1")


def waiting_claim(failure_conditions: list[str], condition: str = "") -> dict[str, Any]:
    """A claim whose fabric result lists ``failure_conditions`` (copied by the
    scheduler from the pool it allocated from), with ``condition`` True."""
    c = claim()
    result = c["status"]["allocation"]["devices"]["results"][0]
    result["bindingConditions"] = [READY_CONDITION]
    result["bindingFailureConditions"] = failure_conditions
    if condition:
        cond = cl.condition(condition, "AttachFailed", "boom", None)
        c["status"]["devices"] = cl.devices_with_condition(c, "fabric", "v1", cond)
    return c


def test_the_failure_condition_written_is_the_one_the_result_lists() -> None:
    (new,) = cl.fabric_allocations(waiting_claim([FAILED_CONDITION]), "fabric")
    assert new.failure_condition == FAILED_CONDITION and new.waits
    # Allocated from an older controller's pool: the scheduler watches the old name.
    (old,) = cl.fabric_allocations(waiting_claim([LEGACY_FAILED_CONDITION]), "fabric")
    assert old.failure_condition == LEGACY_FAILED_CONDITION
    (other,) = cl.fabric_allocations(waiting_claim(["SomeoneElses"]), "fabric")
    assert other.failure_condition == FAILED_CONDITION


def test_a_claim_an_older_controller_failed_reads_as_failed() -> None:
    for name in (FAILED_CONDITION, LEGACY_FAILED_CONDITION):
        (a,) = cl.fabric_allocations(waiting_claim([LEGACY_FAILED_CONDITION], name), "fabric")
        assert a.failed and not a.ready
    (a,) = cl.fabric_allocations(waiting_claim([FAILED_CONDITION], "SomeoneElses"), "fabric")
    assert not a.failed
