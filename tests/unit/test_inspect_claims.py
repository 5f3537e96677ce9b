"""``kubectl patchbay claims`` on recorded objects: binding states and last errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import yaml

from driver.fabric_devices.naming import FAILED_CONDITION
from driver.inspect.claims import claims_view, render_claims
from driver.inspect.cli import parser, render, wants
from driver.inspect.events import event_time
from driver.inspect.fetch import Snapshot, Wants, default_namespace
from tests.unit.inspect_node_objects import claim, gpu, local_slice
from tests.unit.inspect_objects import (
    condition,
    event,
    fabric_claim,
    fabric_slices,
    pending_claim,
)

NOW = datetime(2026, 12, 1, 10, 0, 42, tzinfo=UTC)


def cluster() -> tuple[list[dict], list[dict], list[dict]]:  # type: ignore[type-arg]
    slices = [local_slice([gpu(0)]), *fabric_slices()]
    ready = condition("FabricDeviceReady", "Attached", "gpu-0 attached", "2026-12-01T10:00:03Z")
    failed = condition(
        FAILED_CONDITION,
        "AttachFailed",
        "injected failure: attach of gpu-1 failed",
        "2026-12-01T10:00:05Z",
    )
    claims = [
        fabric_claim("waiting", "nic-0", "node-a", pod=""),
        fabric_claim("attached", "gpu-0", "node-b", [ready], pod="runner"),
        fabric_claim("broken", "gpu-1", "node-a", [failed]),
        claim("local", "gpu-0", pod="trainer"),
        pending_claim("pending", "retry"),
        {"metadata": {"namespace": "team", "name": "not-ours"}, "status": {}},
    ]
    events = [
        event(
            "Pod",
            "trainer",
            "FailedPrepareDynamicResources",
            "old error",
            lastTimestamp="2026-12-01T09:00:00Z",
            count=3,
        ),
        event(
            "Pod",
            "trainer",
            "FailedPrepareDynamicResources",
            "Failed to prepare dynamic resources: bad config",
            eventTime="2026-12-01T09:01:00.000000Z",
            series={"count": 2, "lastObservedTime": "2026-12-01T09:30:00.000000Z"},
        ),
        event(
            "Pod",
            "trainer",
            "FailedScheduling",
            "0/3 nodes are available",
            lastTimestamp="2026-12-01T09:59:00Z",
        ),
        event(
            "Pod",
            "trainer",
            "Started",
            "normal",
            type="Normal",
            lastTimestamp="2026-12-01T09:59:30Z",
        ),
        event(
            "ResourceClaim",
            "broken",
            "AttachFailed",
            "attaching gpu-1 failed: task failed",
            lastTimestamp="2026-12-01T10:00:05Z",
        ),
        event(
            "Pod",
            "retry",
            "FailedScheduling",
            'running PreBind plugin "DynamicResources": device binding failed: claim=pending, '
            'reason=AttachFailed, message="injected failure: attach of gpu-1 to node-a failed"',
            lastTimestamp="2026-12-01T09:58:00Z",
        ),
    ]
    return slices, claims, events


def test_binding_state_of_each_fabric_device() -> None:
    slices, claims, events = cluster()
    rows = {v["name"]: v for v in claims_view(slices, claims, events, NOW)}
    assert "not-ours" not in rows, "a claim for no class of ours is left out"
    (waiting,) = rows["waiting"]["devices"]
    assert waiting["binding"] == {"state": "attaching", "seconds": 42.0}
    assert waiting["type"] == "vf" and rows["waiting"]["node"] == "node-a"
    assert rows["attached"]["devices"][0]["binding"] == {"state": "ready", "seconds": 3.0}
    assert rows["attached"]["state"] == "reserved" and rows["attached"]["pods"] == ["runner"]
    broken = rows["broken"]["devices"][0]["binding"]
    assert broken["state"] == "failed" and broken["reason"] == "AttachFailed"
    assert "binding" not in rows["local"]["devices"][0], "no binding conditions on a local GPU"
    assert rows["pending"]["state"] == "pending" and rows["pending"]["devices"] == []


def test_last_error_is_the_newest_prepare_or_binding_failure_event() -> None:
    slices, claims, events = cluster()
    rows = {v["name"]: v for v in claims_view(slices, claims, events, NOW)}
    err = rows["local"]["lastError"]
    # The series' last observation (09:30) beats the older event's 09:00;
    # FailedScheduling without a binding failure and Normal events are no errors.
    assert err["message"] == "Failed to prepare dynamic resources: bad config"
    assert err["object"] == "pod/trainer" and err["count"] == 2
    assert err["time"] == "2026-12-01T09:30:00.000000Z"
    # A deallocated claim: its owner pod's binding-failure event keeps the reason.
    assert rows["pending"]["lastError"]["message"].startswith(
        'device binding failed: claim=pending, reason=AttachFailed, message="injected failure'
    ), "the scheduler's prefix is cut"
    assert rows["attached"]["lastError"] is None
    # The controller's Warning on the claim itself.
    assert rows["broken"]["lastError"]["object"] == "resourceclaim/broken"


def test_event_time_prefers_the_newest_stamp() -> None:
    e = {
        "eventTime": "2026-12-01T09:00:00.5Z",
        "lastTimestamp": None,
        "metadata": {"creationTimestamp": "2026-12-01T08:00:00Z"},
    }
    assert event_time(e) == "2026-12-01T09:00:00.5Z"
    assert event_time({}) == ""


def test_table_and_namespace_flags() -> None:
    slices, claims, events = cluster()
    text = render_claims(claims_view(slices, claims, events, NOW), all_ns=False)
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "NODE", "DEVICE", "BINDING", "LAST", "ERROR"]
    (waiting,) = [x for x in lines if x.startswith("waiting ")]
    assert "fabric/fnic-0-node-a-adapter1" in waiting and "attaching 42s" in waiting
    (broken,) = [x for x in lines if x.startswith("broken ")]
    assert broken.split()[4:7] == ["failed", "AttachFailed", "AttachFailed:"]
    (local,) = [x for x in lines if x.startswith("local ")]
    assert local.split()[:4] == ["local", "reserved", "node-a", "node-a/gpu-0"]
    assert local.endswith("FailedPrepareDynamicResources: Failed to prepare dynamic re…")
    snap = Snapshot(slices, claims, events)
    args = parser().parse_args(["claims", "-A", "-o", "json"])
    assert {v["namespace"] for v in json.loads(render(args, snap, NOW))} == {"team"}
    args = parser().parse_args(["--kubeconfig", "/nonexistent", "claims", "-n", "other"])
    assert render(args, snap, NOW).splitlines() == [
        "NAME   STATE   NODE   DEVICE   BINDING   LAST ERROR"
    ]
    wide = render(parser().parse_args(["claims", "-A", "-o", "wide"]), snap, NOW)
    assert wide.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"] and "PODS" in wide
    assert "failed AttachFailed: injected failure: attach of gpu-1 failed" in wide
    assert "Failed to prepare dynamic resources: bad config" in wide


def test_the_contexts_namespace_and_yaml(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "current-context: a\ncontexts:\n- name: a\n  context: {namespace: team}\n"
        "- name: b\n  context: {cluster: x}\n"
    )
    slices, claims, events = cluster()
    snap = Snapshot(slices, claims, events)
    args = parser().parse_args(["claims", "--kubeconfig", str(kubeconfig), "-o", "yaml"])
    assert {v["namespace"] for v in yaml.safe_load(render(args, snap, NOW))} == {"team"}
    assert default_namespace(str(kubeconfig), "b") == "default"
    args = parser().parse_args(["--kubeconfig", str(kubeconfig), "--context", "b", "claims"])
    assert wants(args) == Wants(events=True, namespace="default")
    assert wants(parser().parse_args(["fabric"])) == Wants(events=True, nodes=True)
