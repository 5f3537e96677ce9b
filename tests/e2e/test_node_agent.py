"""The node agent does the kubelet's part: a Ready node, a lease, running pods.

Why this module exists: plugin-level e2e tests rely on the node agent
(hack/k8s/cmd/node-agent, built from the kubelet's DRA and plugin manager
packages) to register nodes and run pods. These tests prove its node and
pod lifecycle on the real control plane without any DRA plugin.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.harness import cluster as localk8s

pytestmark = pytest.mark.cluster


@pytest.fixture
def agent(
    local_cluster: localk8s.LocalCluster, core: client.CoreV1Api
) -> Iterator[localk8s.NodeAgent]:
    name = unique("agent")
    node_agent = localk8s.NodeAgent(local_cluster, name, labels={"patchbay.dev/e2e": "agent"})
    node_agent.start()
    yield node_agent
    node_agent.stop()
    delete_quietly(core.delete_node, name)


def _ready(core: client.CoreV1Api, name: str) -> bool:
    try:
        node = core.read_node(name)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def test_agent_registers_a_ready_node_with_a_lease(
    agent: localk8s.NodeAgent, core: client.CoreV1Api, api_client: client.ApiClient
) -> None:

    def ready() -> bool:
        agent.check_alive()
        return _ready(core, agent.node_name)

    wait_for(f"node {agent.node_name} Ready", ready)
    node = core.read_node(agent.node_name)
    assert node.metadata.labels["patchbay.dev/e2e"] == "agent"
    assert node.metadata.labels["kubernetes.io/hostname"] == agent.node_name
    assert node.status.allocatable["pods"] == "110"
    assert node.status.capacity["cpu"] == "8"
    leases = client.CoordinationV1Api(api_client)
    lease = wait_for(
        "the node lease",
        lambda: _read_lease(leases, agent.node_name),
    )
    assert lease.spec.holder_identity == agent.node_name
    assert lease.spec.renew_time is not None


def _read_lease(leases: client.CoordinationV1Api, name: str) -> object:
    try:
        return leases.read_namespaced_lease(name, "kube-node-lease")
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def _pod(name: str, node: str, annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "main", "image": "busybox"},
                {"name": "side", "image": "busybox"},
            ],
        },
    }


def test_agent_runs_completes_and_finalises_pods_without_claims(
    agent: localk8s.NodeAgent, core: client.CoreV1Api, namespace: str
) -> None:
    wait_for(f"node {agent.node_name} Ready", lambda: _ready(core, agent.node_name))
    core.create_namespaced_pod(namespace, _pod("runner", agent.node_name))

    def running() -> object:
        agent.check_alive()
        pod = core.read_namespaced_pod("runner", namespace)
        return pod.status.phase == "Running" and pod

    pod = wait_for("the agent to mark the pod Running", running)
    assert pod.spec.node_name == agent.node_name
    assert {c.type for c in pod.status.conditions if c.status == "True"} >= {
        "Ready",
        "ContainersReady",
    }
    assert sorted(cs.name for cs in pod.status.container_statuses) == ["main", "side"]
    assert all(cs.ready and cs.state.running for cs in pod.status.container_statuses)
    record = agent.pod_record(namespace, "runner")
    assert record is not None
    assert record["uid"] == pod.metadata.uid
    assert record["containers"] == {
        name: {"cdiDevices": [], "deviceNodes": [], "env": [], "mounts": []}
        for name in ("main", "side")
    }

    core.create_namespaced_pod(
        namespace, _pod("short", agent.node_name, {"patchbay.dev/complete-after": "2s"})
    )
    wait_for(
        "the annotated pod to complete",
        lambda: core.read_namespaced_pod("short", namespace).status.phase == "Succeeded",
        timeout=60,
    )

    core.delete_namespaced_pod("runner", namespace)  # default grace: the agent finalises it

    def gone() -> bool:
        try:
            core.read_namespaced_pod("runner", namespace)
        except ApiException as err:
            return bool(err.status == 404)
        return False

    wait_for("the agent to finalise the deleted pod", gone, timeout=60)
    assert agent.pod_record(namespace, "runner") is None
