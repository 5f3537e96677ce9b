"""``kubectl patchbay leases`` on recorded claims: holder, reason, devices,
start, expiry and how far off, state, idle since (issue 37)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from driver.errors import ConfigError
from driver.idleterms import BELOW_THRESHOLD, BUSY, IDLE, UNKNOWN, busy_message, idle_message
from driver.inspect.cli import parser, render, wants
from driver.inspect.extend import request_extension
from driver.inspect.fetch import Snapshot, Wants
from driver.inspect.leases import leases_view, render_leases
from driver.kube.api import RESOURCE_V1, claim_path
from driver.kube.memory import MemoryKube
from driver.leaseterms import (
    EXPIRY,
    EXTEND_BY,
    EXTEND_ID,
    EXTEND_REASON,
    HOLDER,
    PHASE,
    REASON,
    START,
    WARNED,
)
from tests.unit.inspect_node_objects import claim

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


def leased(name: str, *devices: str, **notes: str) -> dict[str, Any]:
    c = claim(name, *devices, pod="p")
    c["metadata"]["annotations"] = notes
    return c


def claims() -> list[dict[str, Any]]:
    training = leased("training", "gpu-0", **{
        HOLDER: "alice", REASON: "fine-tuning, ticket ML-482",
        START: "2026-12-01T08:00:00Z", EXPIRY: "2026-12-01T12:00:00Z",
    })  # fmt: skip
    training["status"]["devices"] = [{
        "driver": "patchbay.dev", "pool": "node-a", "device": "gpu-0",
        "conditions": [{"type": "Idle", "status": "True",
                        "lastTransitionTime": "2026-12-01T09:30:00Z"}],
    }]  # fmt: skip
    ending = leased("ending", "gpu-1", **{
        HOLDER: "bob", REASON: "notebook", START: "2026-12-01T06:00:00Z",
        EXPIRY: "2026-12-01T10:15:00Z", PHASE: WARNED,
    })  # fmt: skip
    waiting = claim("waiting")
    waiting["status"] = {}
    waiting["spec"] = {"devices": {"requests": [{"name": "g", "exactly": {
        "deviceClassName": "gpu.patchbay.dev"}}]}}  # fmt: skip
    waiting["metadata"]["annotations"] = {HOLDER: "carol"}
    unleased = claim("plain", "gpu-2")  # no lease annotations: not listed
    return [training, ending, waiting, unleased]


def test_each_leased_claim_shows_who_why_and_until_when() -> None:
    rows = {r["name"]: r for r in leases_view(claims(), NOW)}
    assert set(rows) == {"training", "ending", "waiting"}
    t = rows["training"]
    assert (t["holder"], t["reason"], t["devices"]) == (
        "alice", "fine-tuning, ticket ML-482", ["node-a/gpu-0"],
    )  # fmt: skip
    assert (t["state"], t["secondsLeft"], t["idleSince"]) == (
        "active",
        7200,
        "2026-12-01T09:30:00Z",
    )
    assert rows["ending"]["state"] == "expiring"
    assert rows["waiting"]["state"] == "pending" and rows["waiting"]["expires"] == ""
    text = render_leases(leases_view(claims(), NOW), all_ns=False)
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "HOLDER", "REASON", "DEVICES", "STATE", "EXPIRES",
                                "IDLE", "SINCE"]  # fmt: skip
    assert "2026-12-01T10:15:00Z (in 15m)" in text
    assert "2026-12-01T12:00:00Z (in 2h)" in text


def test_the_leases_command_reads_one_namespace_and_prints_json() -> None:
    args = parser().parse_args(["leases", "-n", "team", "-o", "json"])
    assert wants(args) == Wants(namespace="team")
    out = json.loads(render(args, Snapshot([], claims()), NOW))
    assert [r["name"] for r in out] == ["ending", "training", "waiting"]
    args = parser().parse_args(["leases", "-n", "elsewhere"])
    assert render(args, Snapshot([], claims()), NOW).splitlines()[1:] == []


async def test_lease_extend_writes_a_new_request_as_the_user() -> None:
    args = parser().parse_args(["lease", "extend", "c", "--by", "2h", "--reason", "epoch 9"])
    assert (args.command, args.action, args.claim, args.by) == ("lease", "extend", "c", "2h")
    api = MemoryKube()
    api.add(f"{RESOURCE_V1}/namespaces/team/resourceclaims", leased("c", "gpu-0"))
    path = claim_path("team", "c")
    first = await request_extension(api, "team", "c", "2h", "epoch 9")
    second = await request_extension(api, "team", "c", "2h", "epoch 9")
    notes = (await api.get(path))["metadata"]["annotations"]
    assert (notes[EXTEND_BY], notes[EXTEND_REASON], notes[EXTEND_ID]) == ("2h", "epoch 9", second)
    assert first != second  # the same ask twice is two requests
    with pytest.raises(ConfigError, match="--by: 'soon' is not a duration"):
        await request_extension(api, "team", "c", "soon", "x")


def test_wide_shows_each_devices_utilization_as_its_node_last_reported_it() -> None:
    c = leased("mixed", "gpu-0", "gpu-1", "gpu-2", "vf-0", **{
        HOLDER: "alice", REASON: "sweep", START: "2026-12-01T08:00:00Z",
        EXPIRY: "2026-12-01T12:00:00Z",
    })  # fmt: skip
    said = {
        "gpu-0": {"type": IDLE, "status": "True", "reason": BELOW_THRESHOLD,
                  "message": idle_message(5, 1800, "2026-12-01T09:00:00Z", 2)},
        "gpu-1": {"type": IDLE, "status": "False", "reason": BUSY,
                  "message": busy_message(37.4, 5)},
        "gpu-2": {"type": IDLE, "status": "False", "reason": UNKNOWN, "message": "no NVML"},
    }  # fmt: skip
    c["status"]["devices"] = [
        {"driver": "patchbay.dev", "pool": "node-a", "device": d, "conditions": [cond]}
        for d, cond in said.items()
    ] + [{"driver": "other.dev", "pool": "node-a", "device": "vf-0", "conditions": [
        {"type": IDLE, "status": "True", "message": idle_message(1, 1, "x", 0)}]}]  # fmt: skip
    (row,) = leases_view([c], NOW)
    assert row["utilization"] == ["<5%", "37%", "unknown", "-"]  # vf-0: no source, nothing said
    lines = render_leases([row], wide=True, all_ns=False).splitlines()
    assert lines[0].split()[-1] == "UTILIZATION"
    assert lines[1].split()[-1] == "<5%,37%,unknown,-"
    assert "UTILIZATION" not in render_leases([row], all_ns=False)
