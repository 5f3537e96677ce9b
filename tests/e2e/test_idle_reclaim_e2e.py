"""Idle devices taken back on the real control plane (issue 37, the controller's half).

How: a simulated node runs our plugin with two mock GPUs; the controller
runs with ``--device-leases`` and the chart's RBAC
(``tests.e2e.lease_cluster``). A pod runs on a standalone claim; the
claim's device is then marked ``Idle=True`` exactly as the node plugin
writes it: the plugin's own writer (``driver.idle.conditions``), its
message from ``driver.idleterms``, sent with the chart's plugin RBAC and a
token bound to a pod on the claim's node (``tests.e2e.plugin_token``), the
only identity the apiserver lets write it. The node's own sampler is off,
so the marks are the test's alone.

- Under a policy whose idle rule is ``Event`` the claim and its pod get
  ``DevicesIdle`` and keep running; a second policy whose rule is
  ``Reclaim``, created once the warning is seen, takes the device back:
  ``IdleReclaimed``, the pod evicted, the standalone claim deleted.
- Under a policy in audit mode, the reclaim is ``LeaseWouldEvict`` and
  nothing is evicted.

Waits are on Events and on the pod and claim going, never on a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from driver.idle.conditions import ConditionWriter, condition, timestamp
from driver.idle.sources import Held
from driver.idleterms import BELOW_THRESHOLD, idle_message
from driver.kube.api import KubeApi
from tests.e2e import pods
from tests.e2e.chart import Applier
from tests.e2e.helpers import delete_quietly, events_about, unique, wait_for
from tests.e2e.lease_cluster import claim_gone, controller, leases, metric, reasons
from tests.e2e.plugin_nodes import plugin_node
from tests.e2e.plugin_token import install_plugin_rbac, pod_bound_token, token_kubeconfig
from tests.harness.cluster import LocalCluster
from tests.harness.fabricsim import ControllerProcess
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster
__all__ = ["controller", "leases"]  # the shared fixtures

NODE_THRESHOLD = 5  # percent, as the node's message states it


@pytest.fixture(scope="module")
def node(local_cluster: LocalCluster, resource_api: client.ResourceV1Api,
         core: client.CoreV1Api) -> Iterator[SimNode]:  # fmt: skip
    with plugin_node(local_cluster, resource_api, core, "reclaim", "2-gpus",
                     args=("--idle-sample-interval=0",), ready=lambda n: n == 2,
                     what="two GPUs published") as sim:  # fmt: skip
        yield sim


@pytest.fixture(scope="module")
def plugin_token(
    helm: Path, local_cluster: LocalCluster, api_client: client.ApiClient,
    core: client.CoreV1Api, node: SimNode, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:  # fmt: skip
    """A kubeconfig with the chart's plugin identity: a token bound to a pod on ``node``."""
    namespace = unique("pbrc")
    core.create_namespace({"metadata": {"name": namespace}})
    applier = Applier(api_client)
    try:
        sa, _ = install_plugin_rbac(helm, applier, unique("pbr"), namespace)
        _, token = pod_bound_token(core, namespace, sa, node.name)
        yield token_kubeconfig(
            tmp_path_factory.mktemp("reclaim") / "plugin.kubeconfig", local_cluster, token
        )
    finally:
        applier.cleanup()
        with contextlib.suppress(client.ApiException):
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_quietly(core.delete_namespace, namespace)


def team(core: client.CoreV1Api, ns: str) -> str:
    """Label ``ns`` for policies of its own; the label's value."""
    label = unique("idle")
    core.patch_namespace(ns, {"metadata": {"labels": {"idle-team": label}}})
    return label


def policy(leases: Any, label: str, **spec: Any) -> str:
    """A DeviceLeasePolicy over the namespace labelled ``label``; its name."""
    name = unique("idle")
    spec = {"namespaceSelector": {"matchLabels": {"idle-team": label}},
            "deviceClassNames": ["gpu.patchbay.dev"], "evictionGracePeriodSeconds": 1,
            **spec}  # fmt: skip
    leases.create(body={"apiVersion": "patchbay.dev/v1alpha1", "kind": "DeviceLeasePolicy",
                        "metadata": {"name": name}, "spec": spec})  # fmt: skip
    return name


def told(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    """What the idle reclaim said about ``name``, oldest first."""
    said = {"DevicesIdle", "IdleReclaimed", "LeaseWouldEvict", "LeaseEvictionBlocked"}
    return [r for r in reasons(core, ns, name, "") if r in said]


def running_claim(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, ns: str, node: SimNode
) -> tuple[str, Held]:
    """A standalone GPU claim and a running pod ``p`` on it; the claim and its device."""
    name = unique("c")
    resource_api.create_namespaced_resource_claim(ns, {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}},
    })  # fmt: skip
    pods.pod(core, ns, "p", node.name, {"resourceClaimName": name})
    pods.running(core, ns, "p", alive=node.check_alive)
    claim = resource_api.read_namespaced_resource_claim(name, ns)
    (result,) = claim.status.allocation.devices.results
    return name, Held(claim.metadata.uid, ns, name, result.pool, result.device, None)


def mark_idle(kubeconfig: Path, held: Held, since: datetime) -> None:
    """Write ``Idle=True`` as the node plugin does, below the node's threshold since ``since``."""
    now = datetime.now(UTC)
    message = idle_message(NODE_THRESHOLD, 1, timestamp(since), 1)

    async def write() -> None:
        api = await KubeApi.connect(str(kubeconfig))
        try:
            assert await ConditionWriter(api).write(
                held, condition(True, BELOW_THRESHOLD, message, now)
            )
        finally:
            await api.close()

    asyncio.run(write())


def test_an_idle_claim_is_warned_then_reclaimed_and_released(
    node: SimNode, controller: ControllerProcess, leases: Any, plugin_token: Path,
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str,
) -> None:  # fmt: skip
    label = team(core, namespace)
    names = [policy(leases, label, idle={"utilizationBelowPercent": 10, "for": "1s",
                                         "action": "Event"})]  # fmt: skip
    try:
        claim, held = running_claim(core, resource_api, namespace, node)
        since = datetime.now(UTC) - timedelta(seconds=1)
        mark_idle(plugin_token, held, since)
        wait_for("the pod warned", lambda: told(core, namespace, "p") == ["DevicesIdle"],
                 timeout=60)  # fmt: skip
        assert told(core, namespace, claim) == ["DevicesIdle"]
        (idle,) = events_about(core, namespace, claim, "DevicesIdle")
        assert f"devices {held.pool}/{held.device} of " in idle.message
        below = f"below {NODE_THRESHOLD}% (as the node measures) since {timestamp(since)}"
        assert below in idle.message
        assert f"DeviceLeasePolicy {names[0]} idle.for 1s" in idle.message
        assert pods.phase(core, namespace, "p") == "Running"  # an Event takes nothing
        names.append(policy(leases, label, idle={"utilizationBelowPercent": 10, "for": "1s",
                                                 "action": "Reclaim"}))  # fmt: skip
        wait_for("the pod evicted", lambda: pods.phase(core, namespace, "p") == "Gone",
                 timeout=90)  # fmt: skip
        wait_for("the claim released and deleted",
                 lambda: claim_gone(resource_api, namespace, claim), timeout=60)  # fmt: skip
        assert told(core, namespace, claim) == ["DevicesIdle", "IdleReclaimed"]
        assert told(core, namespace, "p") == ["DevicesIdle", "IdleReclaimed"]
        (reclaimed,) = events_about(core, namespace, claim, "IdleReclaimed")
        assert f"DeviceLeasePolicy {names[1]} idle.for 1s" in reclaimed.message
        assert "grace period 1s); the claim is deleted" in reclaimed.message
        assert metric(controller, "patchbay_device_lease_evictions_total") >= 1
    finally:
        for name in names:
            leases.delete(name=name)


def test_audit_mode_reports_the_reclaim_and_evicts_nothing(
    node: SimNode, controller: ControllerProcess, leases: Any, plugin_token: Path,
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str,
) -> None:  # fmt: skip
    rule = {"utilizationBelowPercent": 10, "for": "1s", "action": "Reclaim"}
    name = policy(leases, team(core, namespace), audit=True, idle=rule)
    try:
        claim, held = running_claim(core, resource_api, namespace, node)
        mark_idle(plugin_token, held, datetime.now(UTC) - timedelta(seconds=2))
        wait_for("the would-be eviction reported",
                 lambda: told(core, namespace, "p") == ["LeaseWouldEvict"], timeout=60)  # fmt: skip
        (said,) = events_about(core, namespace, claim, "LeaseWouldEvict")
        assert "audit only (spec.audit)" in said.message
        assert ("1 pod(s) would be evicted (p); the claim would be deleted; nothing is done"
                in said.message)  # fmt: skip
        # The decision is made; a reclaim would have evicted in the same pass.
        pod = core.read_namespaced_pod("p", namespace)
        assert pod.metadata.deletion_timestamp is None
        stored = resource_api.read_namespaced_resource_claim(claim, namespace)
        assert stored.metadata.deletion_timestamp is None
        assert "patchbay.dev/lease-phase" not in (stored.metadata.annotations or {})
        assert metric(controller, "patchbay_device_lease_would_evict_total") >= 1
    finally:
        leases.delete(name=name)
