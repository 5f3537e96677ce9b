"""GPU recovery in the real plugin process: a reset-class XID through the C
mock, the NoExecute taint in the published slice, a restart that keeps it,
the reset by the simulated host's nvidia-smi once nothing holds the GPU, the
check, the GPU published untainted, each step an Event on the Node in order.

Fails with the recovery removed (the GPU stays tainted), with the health
records kept in memory only (checked: the restarted plugin has no record;
it would republish the GPU untainted, which the ``unchanged`` watch sees),
and with the watcher not letting go of its event set (nvidia-smi refuses
the reset, the taint stays: tests/contract/test_gpu_reset.py shows the
refusal).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from kubernetes import client

from fabric.simhost.nvidia_smi import read_record
from fabric.simhost.topologies import TOPOLOGIES
from tests.e2e.helpers import events_about, unchanged, wait_for
from tests.harness.cluster import LocalCluster
from tests.integration.own_node import OwnNode, own_node

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

FLAGS = ("--gpu-health-settle=0",)  # the window's length is not the subject here
STEPS = ["DeviceUnhealthy", "GpuResetWaiting", "GpuResetStarted", "GpuReset", "GpuHealthy"]


@pytest.fixture
def own(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[OwnNode]:
    with own_node(local_cluster, core, "rec", TOPOLOGIES["2-gpus"]()) as node:
        yield node


def test_reset_class_xid_taint_restart_reset_check_healthy(
    own: OwnNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api
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

    plugin.kill()  # a crash while the GPU is unhealthy
    again = own.plugin(*FLAGS, log_name="restarted").start()
    read = "unhealthy since before this start"
    wait_for("the restart read the record", lambda: read in again.log_tail(5000), timeout=60)
    unchanged(resource_api.list_resource_slice, "the pool after the restart", 5, **query)
    assert taints("gpu-1") == sick and taints("gpu-0") == []

    own.host.nvml.set_processes(uuid, [])  # the holder is gone
    wait_for("gpu-1 published untainted", lambda: taints("gpu-1") == [], timeout=120)
    reasons = [e.reason for e in events_about(core, "default", own.name) if e.reason in STEPS]
    # Each process tells its own wait once: the restarted one again.
    steps = [r for i, r in enumerate(reasons) if i == 0 or r != reasons[i - 1]]
    assert steps == STEPS, reasons
    calls = read_record(own.host.dir)["calls"]
    assert isinstance(calls, list) and [c[0] for c in calls] == ["--gpu-reset"]
    assert json.loads((own.base / "plug" / "gpu-health.json").read_text())["gpus"] == {}
