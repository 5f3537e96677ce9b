"""Claims reserved for a PodGroup (KEP-5729): ``status.reservedFor`` names the
group (``scheduling.k8s.io`` ``podgroups``), never its pods. The preparer's
log context and the ``kubectl patchbay`` views show the group; a reader
that kept only ``pods`` entries saw such a claim as held by nobody."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.inspect.claims import claims_view, render_claims
from driver.inspect.fabric import fabric_view, render_fabric
from driver.inspect.inventory import build
from driver.kube.reservations import Reservation, more_pods, pods_of, reserved_for
from driver.logconfig import JsonFormatter
from tests.claims_doubles import NODE, OnceHandler, Reader
from tests.unit.inspect_objects import condition, fabric_claim, fabric_slices, node

NOW = datetime(2026, 12, 1, 10, 0, 30, tzinfo=UTC)
GROUP = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers", "uid": "g"}


def for_group(claim: dict[str, Any]) -> dict[str, Any]:
    claim["status"]["reservedFor"] = [dict(GROUP)]
    return claim


def test_reserved_for_tells_pods_from_pod_groups() -> None:
    claim = {
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "p1", "uid": "1"},
                dict(GROUP),
                # the same resource name in another group is neither
                {"apiGroup": "example.com", "resource": "podgroups", "name": "x"},
                {"apiGroup": "scheduling.k8s.io", "resource": "workloads", "name": "w"},
                {"resource": "pods"},  # no name
            ]
        }
    }
    got = reserved_for(claim)
    assert got == Reservation(pods=("p1",), pod_groups=("trainers",), pod_uids=("1",))
    assert got.labels() == ("p1", "podgroup/trainers")
    assert not reserved_for({"status": {"reservedFor": "odd"}})
    assert reserved_for(None) == Reservation()


async def test_the_preparer_logs_the_group_and_prepares_once_for_its_pods(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each pod of the group on this node makes the kubelet call prepare for
    the same claim (it skips the call while the claim is prepared, but a
    restarted kubelet asks again): the hardware is set up once."""
    inv = NodeInventory()
    inv.replace_pool(NODE, [Device("gpu-0", "gpu", "GPU-0", {"minor": 0})])
    reader = Reader()
    handler = OnceHandler(tmp_path / "dev")
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(reader, inv, {"gpu": handler}, store, CdiRegistry(tmp_path / "cdi"))
    ref = reader.add("shared", ["gpu-0"])
    for_group(reader.claims[("ns", "shared")])
    with caplog.at_level(logging.DEBUG, logger="driver.claims.preparer"):
        answers = [await prep.prepare([ref]) for _ in range(3)]
    assert all(not a[ref.uid].error for a in answers)
    assert len({a[ref.uid] for a in answers}) == 1
    assert handler.calls == [("prepare", "GPU-0")]
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    ok = next(line for line in lines if line["msg"].startswith("prepared "))
    assert ok["pod_group"] == "ns/trainers" and "pod" not in ok
    assert await prep.unprepare([ref]) == {ref.uid: ""}
    assert handler.calls[-1] == ("unprepare", "GPU-0")


def test_kubectl_patchbay_claims_shows_the_group() -> None:
    claim = for_group(fabric_claim("shared", "gpu-0", "node-a", []))
    [view] = claims_view(fabric_slices(), [claim], [], NOW)
    assert view["state"] == "reserved"
    assert view["pods"] == [] and view["podGroups"] == ["trainers"]
    assert "podgroup/trainers" in render_claims([view], wide=True)


def test_kubectl_patchbay_fabric_shows_the_group() -> None:
    ready = [condition("FabricDeviceReady", "Attached", "ok", "2026-12-01T10:00:03Z")]
    claim = for_group(fabric_claim("shared", "gpu-0", "node-a", ready))
    view = fabric_view(fabric_slices(), [claim], [node("node-a")], [], NOW)
    held = next(d for d in view["devices"] if d["device"] == "gpu-0")
    assert held["holder"]["podGroups"] == ["trainers"] and held["holder"]["pods"] == []
    assert "team/shared podgroup trainers" in render_fabric(view)


def test_the_device_inventory_names_the_group_as_holder() -> None:
    claim = for_group(fabric_claim("shared", "gpu-0", "node-a", []))
    inv = build(fabric_slices(), [claim])
    held = [d for d in inv.devices if d.holder is not None]
    assert held and {d.holder.pods for d in held if d.holder} == {("podgroup/trainers",)}


def test_pods_of_a_claim_by_uid_only_where_every_pod_is_named() -> None:
    def claim(*entries: dict[str, Any]) -> dict[str, Any]:
        return {"status": {"reservedFor": list(entries)}}

    a, b = (
        {"resource": "pods", "name": "a", "uid": "u-a"},
        {"resource": "pods", "name": "b", "uid": "u-b"},
    )
    assert pods_of(claim(b, a)) == ["u-a", "u-b"]
    assert pods_of(claim(a, {"resource": "pods", "name": "c"})) is None  # a pod without its UID
    assert pods_of(claim(a, dict(GROUP))) is None  # a PodGroup's pods are not named
    assert pods_of(claim()) is None
    assert more_pods(["u-a"], claim(b)) == ["u-a", "u-b"]
    assert more_pods(None, claim(b)) == ["u-b"]
