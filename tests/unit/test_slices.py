"""Slice building within the apiserver's limits, and write-only-on-change diffing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from driver.devices.model import CounterConsumption, CounterSet, Device, Version
from driver.slices import limits
from driver.slices.build import PoolSpec, build_slices, slice_name_prefix, slice_object
from driver.slices.diff import diff_pool, matches

OWNER = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"}


def gpu(i: int, **extra: Any) -> Device:
    return Device(
        name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}", attributes={"index": i}, **extra
    )


def pool(devices: list[Device], sets: tuple[CounterSet, ...] = ()) -> PoolSpec:
    return PoolSpec(
        driver="patchbay.dev",
        pool_name="n1",
        name_prefix="n1-patchbay",
        node_selection={"nodeName": "n1"},
        devices=tuple(devices),
        counter_sets=sets,
        owner=OWNER,
    )


def test_device_json_uses_tagged_values() -> None:
    d = Device(
        name="gpu-0",
        kind="gpu",
        local_id="x",
        attributes={"flag": True, "index": 3, "uuid": "GPU-x", "cc": Version("9.0.0")},
        capacity={"memory": "80Gi"},
    )
    body = d.to_json()
    assert body["attributes"]["flag"] == {"bool": True}
    assert body["attributes"]["index"] == {"int": 3}
    assert body["attributes"]["cc"] == {"version": "9.0.0"}
    assert body["attributes"]["type"] == {"string": "gpu"}
    assert body["capacity"] == {"memory": {"value": "80Gi"}}


def test_129_devices_split_into_two_slices() -> None:
    slices = build_slices(pool([gpu(i) for i in range(129)]))
    assert [len(s.spec["devices"]) for s in slices] == [128, 1]
    assert [s.name for s in slices] == ["n1-patchbay-0", "n1-patchbay-1"]


def test_devices_with_counters_cap_at_64_and_sets_get_own_slice() -> None:
    use = (CounterConsumption("gpu-0", (("mem0", "1"),)),)
    devices = [gpu(i, consumes_counters=use) for i in range(65)]
    sets = tuple(CounterSet(f"s{i}", (("mem0", "1"),)) for i in range(9))
    slices = build_slices(pool(devices, sets))
    assert [len(s.spec.get("sharedCounters", [])) for s in slices[:2]] == [8, 1]
    assert all("devices" not in s.spec for s in slices[:2])
    assert [len(s.spec["devices"]) for s in slices[2:]] == [64, 1]


def test_invalid_devices_left_out_with_reason(caplog: pytest.LogCaptureFixture) -> None:
    long_name = Device(name="gpu-1", kind="gpu", local_id="y", attributes={"a" * 33: 1})
    bad_version = Device(name="gpu-2", kind="gpu", local_id="z", attributes={"v": Version("1.02")})
    caplog.set_level(logging.ERROR)
    slices = build_slices(pool([gpu(0), long_name, bad_version, gpu(0)]))
    assert [d["name"] for d in slices[0].spec["devices"]] == ["gpu-0"]
    assert "longer than 32" in caplog.text
    assert "semantic version" in caplog.text
    assert "duplicate device name" in caplog.text


def test_limits_attribute_rules() -> None:
    assert limits.attribute_name_problem("resource.kubernetes.io/pcieRoot") is None
    assert limits.attribute_name_problem("9bad") is not None
    assert limits.attribute_name_problem("Bad_Domain!/x") is not None
    too_many = Device(
        name="d", kind="gpu", local_id="d", attributes={f"a{i}": i for i in range(32)}
    )
    assert any("attributes and capacities" in p for p in limits.device_problems(too_many))


def test_empty_pool_still_has_one_slice() -> None:
    slices = build_slices(pool([]))
    assert len(slices) == 1 and slices[0].spec["devices"] == []


def test_prefix_is_bounded() -> None:
    assert len(slice_name_prefix("n" * 300, "patchbay.dev")) <= 200


def stored_from(p: PoolSpec, generation: int = 1) -> dict[str, dict[str, Any]]:
    desired = build_slices(p)
    return {d.name: slice_object(p, d, generation, len(desired)) for d in desired}


def test_diff_in_sync_when_stored_equals_desired_with_defaults() -> None:
    p = pool([gpu(0), gpu(1)])
    stored = stored_from(p, 3)
    # The apiserver may add empty defaults; that is not a difference.
    stored["n1-patchbay-0"]["spec"]["devices"][0]["taints"] = []
    diff = diff_pool(build_slices(p), stored, OWNER)
    assert diff.in_sync and diff.generation == 3


def test_diff_detects_changes_and_bumps_generation() -> None:
    p = pool([gpu(0), gpu(1)])
    stored = stored_from(p, 3)
    changed = pool([gpu(0)])
    diff = diff_pool(build_slices(changed), stored, OWNER)
    assert not diff.in_sync and diff.generation == 4 and diff.to_update == ("n1-patchbay-0",)
    # A deleted slice is recreated.
    diff = diff_pool(build_slices(p), {}, OWNER)
    assert diff.to_create == ("n1-patchbay-0",) and diff.generation == 1
    # An extra slice of our pool is deleted.
    extra = stored_from(pool([gpu(i) for i in range(130)]), 2)
    diff = diff_pool(build_slices(p), extra, OWNER)
    assert diff.to_delete == ("n1-patchbay-1",)


def test_diff_detects_foreign_edits_and_mixed_generations() -> None:
    p = pool([gpu(0)])
    stored = stored_from(p)
    stored["n1-patchbay-0"]["spec"]["devices"][0]["attributes"]["index"] = {"int": 9}
    assert not diff_pool(build_slices(p), stored, OWNER).in_sync
    stored = stored_from(p)
    stored["n1-patchbay-0"]["metadata"]["ownerReferences"] = []
    assert not diff_pool(build_slices(p), stored, OWNER).in_sync


def test_matches_is_strict_about_values() -> None:
    assert matches({"a": [1, 2]}, {"a": [1, 2], "b": None})
    assert not matches({"a": [1, 2]}, {"a": [1, 2], "b": 1})
    assert not matches({"a": [1, 2]}, {"a": [2, 1]})


def test_generation_never_goes_back_after_a_wipe() -> None:
    p = pool([gpu(0)])
    assert diff_pool(build_slices(p), {}, OWNER, last_written=5).generation == 6


def test_empty_pool_is_in_sync_when_the_apiserver_omits_the_empty_list() -> None:
    p = pool([])
    stored = stored_from(p)
    del stored["n1-patchbay-0"]["spec"]["devices"]  # what the apiserver returns
    assert diff_pool(build_slices(p), stored, OWNER).in_sync
