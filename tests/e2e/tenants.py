"""Helpers shared by the tenant e2e modules (test_tenants_e2e.py,
test_admin_access_e2e.py): a simulated node with its plugin, device-plugin
style pods and claim pods, the agent's record of a container, and the check
that a pod got one GPU through the claim the scheduler made for it.

Why this module exists: both modules run pods on simulated nodes the same
way; keeping that here keeps each test about the behaviour it shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubernetes import client

from driver.claims.metadata import base_request
from driver.claims.metadata_files import cdi_device_name
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.plugin_nodes import node_devices
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)

GPU_CLASS = "gpu.patchbay.dev"


def start_node(
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    prefix: str,
    *extra_args: str,
    devices: int = 2,
) -> Iterator[SimNode]:
    """A 2-GPU simulated node with the node agent and a real plugin (for a
    module-scoped fixture to yield from), up once it published at least
    ``devices`` devices; ``extra_args`` go to the plugin."""
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(local_cluster, unique(prefix), "2-gpus", kubeconfig)
    node.plugin.extra_args = extra_args
    node.start()
    try:

        def published() -> bool:
            node.check_alive()
            return len(node_devices(resource_api, node.name)) >= devices

        wait_for("the node's devices published", published, timeout=90)
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


def limits_pod(core: client.CoreV1Api, ns: str, name: str, node: str, resource: str) -> None:
    """A device-plugin style pod: no claim, one extended resource in its limits."""
    container = {"name": "main", "image": "pause", "resources": {"limits": {resource: "1"}}}
    spec = {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container]}
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": spec})


def claim_body(name: str, cls: str = GPU_CLASS, **exactly: Any) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": cls, **exactly}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def container_record(sim: SimNode, ns: str, pod: str) -> dict[str, Any]:
    record = sim.agent.pod_record(ns, pod)
    assert record is not None, f"the agent has no record of {pod}"
    containers = record["containers"]
    assert isinstance(containers, dict)
    (container,) = containers.values()
    assert isinstance(container, dict)
    return container


def visible(container: dict[str, Any]) -> list[str]:
    return [e.split("=", 1)[1] for e in container["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]


def assert_one_gpu_through_the_extended_claim(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, ns: str, pod: str
) -> None:
    """The scheduler made the pod's special claim; the agent prepared it and
    the container resolved its one GPU through the upstream CDI library."""
    status = core.read_namespaced_pod(pod, ns).status
    assert not status.resource_claim_statuses
    special = status.extended_resource_claim_status
    assert special is not None, "the scheduler made no claim for the extended resource"
    claim = resource_api.read_namespaced_resource_claim(special.resource_claim_name, ns)
    (result,) = claim.status.allocation.devices.results
    assert result.driver == "patchbay.dev" and result.pool == sim.name
    (mapping,) = special.request_mappings
    assert mapping.container_name == "main" and mapping.request_name == result.request
    container = container_record(sim, ns, pod)
    uid = claim.metadata.uid
    metadata = cdi_device_name(base_request(result.request))  # the request's file (KEP-5304)
    assert sorted(container["cdiDevices"]) == sorted(
        f"k8s.patchbay.dev/claim={uid}-{d}" for d in (result.device, metadata)
    )
    uuid_of = {d.name: d.attributes["uuid"].string for d in node_devices(resource_api, sim.name)}
    assert visible(container) == [uuid_of[result.device]]
    assert (sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").exists()
