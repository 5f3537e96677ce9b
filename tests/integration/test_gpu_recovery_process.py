"""GPU recovery in the real plugin process: a reset-class XID through the C
mock, the NoExecute taint in the published slice, a restart that keeps it,
the reset by the simulated host's nvidia-smi once nothing holds the GPU, the
check, the GPU published untainted, each step an Event on the Node in order,
and the story on the Node's ``patchbay.dev/health`` annotation as
``kubectl patchbay nodes`` (the kubectl plugin's script) shows it.

Fails with the recovery removed (the GPU stays tainted), with the health
records kept in memory only (checked: the restarted plugin has no record;
it would republish the GPU untainted, which the ``unchanged`` watch sees),
with the watcher not letting go of its event set (nvidia-smi refuses
the reset, the taint stays: tests/contract/test_gpu_reset.py shows the
refusal), and without the health annotation (``nodes`` shows no health).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from driver.health.history import NodeHealth
from fabric.simhost.nvidia_smi import read_record
from fabric.simhost.topologies import TOPOLOGIES
from tests.e2e.helpers import events_about, unchanged, wait_for
from tests.e2e.kubectl_views import kubectl_patchbay
from tests.harness.cluster import LocalCluster
from tests.integration.own_node import OwnNode, own_node

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

FLAGS = ("--gpu-health-settle=0",)  # the window's length is not the subject here
STEPS = ["DeviceUnhealthy", "GpuResetWaiting", "GpuResetStarted", "GpuReset", "GpuHealthy"]
STATES = ["tainted", "resetting", "checking", "healthy"]


def collapsed(items: list[str]) -> list[str]:
    """Repeats in a row once (each process tells its own wait once, say)."""
    return [r for i, r in enumerate(items) if i == 0 or r != items[i - 1]]


@pytest.fixture
def own(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[OwnNode]:
    with own_node(local_cluster, core, "rec", TOPOLOGIES["2-gpus"]()) as node:
        yield node


def test_reset_class_xid_taint_restart_reset_check_healthy(
    own: OwnNode,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    local_cluster: LocalCluster,
) -> None:
    plugin = own.plugin(*FLAGS).start()
    query = {"field_selector": f"spec.nodeName={own.name}"}

    def devices() -> dict[str, client.V1Device]:
        return {d.name: d for s in resource_api.list_resource_slice(**query).items
                for d in s.spec.devices or []}  # fmt: skip

    def taints(name: str) -> list[tuple[str, str, str]]:
        return [(t.key, t.value, t.effect) for t in devices()[name].taints or []]

    wait_for("2 GPUs published", lambda: len(devices()) == 2, timeout=60)
    uuid = devices()["gpu-1"].attributes["uuid"].string
    own.host.nvml.set_processes(uuid, [os.getpid()])  # a process holds it: the reset waits
    own.host.nvml.queue_xid(uuid, 48)  # double-bit ECC: a reset cures it
    sick = [("patchbay.dev/unhealthy", "xid-48", "NoExecute")]
    wait_for("gpu-1 tainted NoExecute", lambda: taints("gpu-1") == sick, timeout=60)
    wait_for("the reset waiting", lambda: events_about(core, "default", own.name,
                                                       "GpuResetWaiting"), timeout=60)  # fmt: skip

    def on_node() -> NodeHealth | None:
        return NodeHealth.from_node(core.api_client.sanitize_for_serialization(
            core.read_node(own.name)))  # fmt: skip

    told = wait_for("the health annotation", on_node, timeout=60)
    sick_gpu = told.gpus[uuid]
    assert (sick_gpu.state, sick_gpu.failure_class, sick_gpu.xid) == ("tainted", "reset", 48)

    plugin.kill()  # a crash while the GPU is unhealthy
    again = own.plugin(*FLAGS, log_name="restarted").start()
    read = "unhealthy since before this start"
    wait_for("the restart read the record", lambda: read in again.log_tail(5000), timeout=60)
    unchanged(resource_api.list_resource_slice, "the pool after the restart", 5, **query)
    assert taints("gpu-1") == sick and taints("gpu-0") == []

    own.host.nvml.set_processes(uuid, [])  # the holder is gone
    wait_for("gpu-1 published untainted", lambda: taints("gpu-1") == [], timeout=120)
    reasons = [e.reason for e in events_about(core, "default", own.name) if e.reason in STEPS]
    assert collapsed(reasons) == STEPS, reasons
    calls = read_record(own.host.dir)["calls"]
    assert isinstance(calls, list) and [c[0] for c in calls] == ["--gpu-reset"]
    assert json.loads((own.base / "plug" / "gpu-health.json").read_text())["gpus"] == {}

    def healthy_shown() -> dict[str, Any] | None:
        views = json.loads(kubectl_patchbay(local_cluster, "nodes", "-o", "json"))
        (view,) = [v for v in views if v["node"] == own.name]
        (row,) = [h for h in view["health"] if h["gpu"] == "gpu-1"]
        return dict(row) if row["state"] == "healthy" else None

    row = wait_for("nodes to show gpu-1 healthy", healthy_shown, timeout=60)
    assert collapsed([t["state"] for t in row["transitions"]]) == STATES, row
    assert (row["uuid"], row["resets"], row["resetLimit"]) == (uuid, 1, 3)
    text = kubectl_patchbay(local_cluster, "nodes")
    assert "  health     gpu-1: healthy, resets 1/3 in 1d" in text, text
