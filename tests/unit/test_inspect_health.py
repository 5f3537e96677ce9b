"""``kubectl patchbay nodes`` shows each failed GPU's health and recent steps,
from the Node's ``patchbay.dev/health`` annotation (recorded objects)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from driver.health.history import HEALTH_ANNOTATION, GpuHistory, NodeHealth
from driver.inspect.cli import parser, render, wants
from driver.inspect.fetch import Snapshot
from driver.inspect.nodes import nodes_view, render_nodes
from tests.unit.inspect_node_objects import NODE, JsonObj, gpu, local_slice

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
STEPS = (
    ("2026-12-03T11:00:00Z", "tainted", "unhealthy", "XID 48, reset class, NoExecute taint"),
    ("2026-12-03T11:02:00Z", "resetting", "resetting", "no claim uses it: resetting"),
    ("2026-12-03T11:02:05Z", "checking", "reset", "reset done: checking it"),
    ("2026-12-03T11:03:05Z", "healthy", "healthy", "check passed 125 s after the failure"),
)


def node_with_health() -> JsonObj:
    health = NodeHealth(3, 86400, {
        "GPU-0": GpuHistory("healthy", resets=("2026-12-01T11:02:00Z", "2026-12-03T11:02:00Z"),
                            steps=STEPS),
        "GPU-1": GpuHistory("failed", "reset", 48, "reset-failed", "2026-12-03T11:30:00Z",
                            steps=(("2026-12-03T11:30:00Z", "failed", "reset-failed",
                                    "the reset failed: " + "e" * 100),)),
        "GPU-gone": GpuHistory("tainted", "replace", 79, "", "2026-12-03T10:00:00Z"),
    })  # fmt: skip
    text = health.to_annotation()
    assert text is not None
    return {"metadata": {"name": NODE, "annotations": {HEALTH_ANNOTATION: text}}}


def test_nodes_shows_state_class_reason_resets_and_transitions() -> None:
    slices = [local_slice([gpu(0), gpu(1)])]
    (view,) = nodes_view(slices, [], [node_with_health()], NOW)
    rows = {r["gpu"] or r["uuid"]: r for r in view["health"]}
    assert list(rows) == ["gpu-0", "gpu-1", "GPU-gone"]  # by device name; unnamed last
    g0, g1 = rows["gpu-0"], rows["gpu-1"]
    assert (g0["state"], g0["resets"], g0["resetLimit"]) == ("healthy", 1, 3)  # 1 in the window
    assert [t["state"] for t in g0["transitions"]] == [
        "tainted", "resetting", "checking", "healthy"
    ]  # fmt: skip
    assert g0["transitions"][0]["time"] == "2026-12-03T11:00:00Z"
    assert (g1["state"], g1["class"], g1["xid"], g1["reason"]) == ("failed", "reset", 48,
                                                                    "reset-failed")  # fmt: skip
    lines = render_nodes([view]).splitlines()
    at = lines.index("  health     gpu-0: healthy, resets 1/3 in 1d")
    assert lines[at + 1].split(None, 3) == [
        "2026-12-03T11:00:00Z", "tainted", "unhealthy", "XID 48, reset class, NoExecute taint"
    ]  # fmt: skip
    assert lines[at + 4].split()[:3] == ["2026-12-03T11:03:05Z", "healthy", "healthy"]
    assert (
        "  health     gpu-1: failed (reset class, XID 48: reset-failed) since "
        "2026-12-03T11:30:00Z, resets 0/3 in 1d" in lines
    )
    assert lines[lines.index("  health     GPU-gone: tainted (replace class, XID 79) since "
                             "2026-12-03T10:00:00Z, resets 0/3 in 1d") + 1:] == []  # fmt: skip
    cut = next(line for line in lines if "reset-failed  the reset failed" in line)
    assert cut.endswith("e…") and len(cut.split("  ")[-1]) == 61
    wide = render_nodes([view], wide=True)
    assert "the reset failed: " + "e" * 100 in wide


def test_a_node_without_the_annotation_shows_no_health_and_the_cli_reads_nodes() -> None:
    slices = [local_slice([gpu(0)])]
    (view,) = nodes_view(slices, [], [{"metadata": {"name": NODE}}], NOW)
    assert view["health"] == []
    assert "health" not in render_nodes([view])
    args = parser().parse_args(["nodes", "-o", "json"])
    assert wants(args).nodes, "the health annotation is on the Node objects"
    (shown,) = json.loads(render(args, Snapshot(slices, [], [], [node_with_health()]), NOW))
    assert [r["gpu"] for r in shown["health"]] == ["gpu-0", "", ""]
