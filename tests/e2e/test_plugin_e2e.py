"""patchbay end to end on the real control plane.

Two simulated nodes (4 and 2 GPUs), each with the node agent (the kubelet's
DRA manager) and a real plugin process. The real scheduler allocates from
the slices we publish; the node agent prepares through our socket and
resolves the CDI IDs with the upstream CDI library.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from driver.claims.metadata import base_request
from driver.claims.metadata_files import cdi_device_name
from tests.e2e.helpers import delete_quietly, events_about, unique, wait_for
from tests.e2e.plugin_nodes import node_devices, node_slices
from tests.e2e.pods import phase, refused
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SIZES = {"4x-h100": 4, "2-gpus": 2}

# The sick-GPU test watches a pod stay on its GPU with the health in its status:
# the reset class's taint NoSchedule (not the default NoExecute, which evicts the
# pod) and no reset (docs/health.md).
HEALTH_ARGS = ("--reset-class-taint=NoSchedule", "--gpu-reset=false")


@pytest.fixture(scope="module")
def nodes(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[dict[str, SimNode]]:
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    sims = {
        topo: SimNode(local_cluster, unique("gpu"), topo, kubeconfig, HEALTH_ARGS).start()
        for topo in SIZES
    }
    try:
        for topo, sim in sims.items():
            wait_for(
                f"{SIZES[topo]} devices of {sim.name} published",
                lambda sim=sim, n=SIZES[topo]: (
                    sim.check_alive(),
                    len(node_devices(resource_api, sim.name)) == n,
                )[1],
                timeout=90,
            )
        yield sims
    finally:
        for sim in sims.values():
            sim.stop()
            delete_quietly(core.delete_node, sim.name)


def gpu_pod(core: client.CoreV1Api, namespace: str, name: str, node: str, template: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {"name": "main", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            },
        },
    )


def template(resource_api: client.ResourceV1Api, namespace: str, count: int) -> str:
    name = f"gpus-{count}"
    resource_api.create_namespaced_resource_claim_template(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "gpu.patchbay.dev",
                                    "allocationMode": "ExactCount",
                                    "count": count,
                                },
                            }
                        ]
                    }
                }
            },
        },
    )
    return name


def test_slices_pass_validation_with_topology(
    nodes: dict[str, SimNode], resource_api: client.ResourceV1Api
) -> None:
    for topo, sim in nodes.items():
        (slc,) = node_slices(resource_api, sim.name)
        assert slc.spec.pool.name == sim.name and slc.spec.pool.resource_slice_count == 1
        devs = slc.spec.devices
        assert len(devs) == SIZES[topo]
        assert {d.attributes["uuid"].string for d in devs} == set(sim.host.gpu_uuids().values())
        for d in devs:
            assert d.attributes["resource.kubernetes.io/pcieRoot"].string.startswith("pci")
            assert d.capacity["memory"].value.endswith("Mi")


def test_pod_gets_gpus_and_frees_them(
    nodes: dict[str, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    sim = nodes["2-gpus"]
    tmpl = template(resource_api, namespace, 2)
    gpu_pod(core, namespace, "first", sim.name, tmpl)
    wait_for("first pod Running", lambda: phase(core, namespace, "first") == "Running", timeout=90)
    record = sim.agent.pod_record(namespace, "first")
    assert record is not None
    containers = record["containers"]
    assert isinstance(containers, dict)
    (container,) = containers.values()
    claim = resource_api.read_namespaced_resource_claim(
        core.read_namespaced_pod("first", namespace)
        .status.resource_claim_statuses[0]
        .resource_claim_name,
        namespace,
    )
    uid = claim.metadata.uid
    devices = sorted(r.device for r in claim.status.allocation.devices.results)
    assert devices == ["gpu-0", "gpu-1"]
    # Each GPU's own spec device, and the request's metadata mount (KEP-5304).
    requests = {base_request(r.request) for r in claim.status.allocation.devices.results}
    named = devices + [cdi_device_name(r) for r in requests]
    assert sorted(container["cdiDevices"]) == sorted(
        f"k8s.patchbay.dev/claim={uid}-{d}" for d in named
    )
    # Every GPU of the claim, in the claim's order, as the upstream CDI library
    # resolved the container's devices (one device's edit must not hide another's).
    uuid_of = {d.name: d.attributes["uuid"].string for d in node_devices(resource_api, sim.name)}
    (visible,) = [
        e.split("=", 1)[1] for e in container["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")
    ]
    results = claim.status.allocation.devices.results
    assert visible.split(",") == [uuid_of[r.device] for r in results]
    assert set(visible.split(",")) == set(sim.host.gpu_uuids().values())
    assert "/dev/nvidiactl" in {n["path"] for n in container["deviceNodes"]}
    spec_file = sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json"
    assert spec_file.exists()

    gpu_pod(core, namespace, "second", sim.name, tmpl)
    refused(core, namespace, "second")  # both GPUs are the first pod's
    assert phase(core, namespace, "second") == "Pending"
    core.delete_namespaced_pod("first", namespace)
    wait_for("first pod gone", lambda: phase(core, namespace, "first") == "Gone", timeout=60)
    assert not spec_file.exists(), "unprepare removes the claim's CDI spec"
    wait_for(
        "second pod Running", lambda: phase(core, namespace, "second") == "Running", timeout=90
    )


def test_deleted_slice_is_restored(
    nodes: dict[str, SimNode], resource_api: client.ResourceV1Api
) -> None:
    sim = nodes["4x-h100"]
    (slc,) = node_slices(resource_api, sim.name)
    resource_api.delete_resource_slice(slc.metadata.name)
    wait_for(
        "slice restored",
        lambda: (
            [s.metadata.uid for s in node_slices(resource_api, sim.name)]
            not in ([], [slc.metadata.uid])
        ),
        timeout=30,
    )
    (again,) = node_slices(resource_api, sim.name)
    assert len(again.spec.devices) == 4
    assert again.spec.pool.generation > slc.spec.pool.generation


def test_idle_node_makes_zero_slice_writes(
    nodes: dict[str, SimNode], resource_api: client.ResourceV1Api
) -> None:
    sim = nodes["4x-h100"]
    listing = resource_api.list_resource_slice(field_selector=f"spec.nodeName={sim.name}")
    events: list[str] = []
    w = watch.Watch()

    def collect() -> None:
        for ev in w.stream(
            resource_api.list_resource_slice,
            field_selector=f"spec.nodeName={sim.name}",
            resource_version=listing.metadata.resource_version,
            timeout_seconds=65,
        ):
            events.append(ev["type"])

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    thread.join(timeout=70)
    w.stop()
    sim.check_alive()
    assert events == [], f"an idle node wrote its slices: {events}"


def test_a_failed_prepare_is_the_kubelets_event_on_the_pod(
    nodes: dict[str, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    # The node agent records what the kubelet records (pkg/kubelet/kuberuntime),
    # with the kubelet's recorder: kubectl patchbay and the real-node tier read the same.
    sim = nodes["2-gpus"]
    bad = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "GpuConfig", "timeSlice": "Short"}
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}
    config = {"requests": ["gpu"], "opaque": {"driver": "patchbay.dev", "parameters": bad}}
    resource_api.create_namespaced_resource_claim_template(namespace, {
        "metadata": {"name": "bad-config"},
        "spec": {"spec": {"devices": {"requests": [request], "config": [config]}}},
    })  # fmt: skip
    gpu_pod(core, namespace, "bad", sim.name, "bad-config")
    reason = "FailedPrepareDynamicResources"

    def config_refused() -> list[Any]:  # (an earlier try may fail on the Node authorizer's graph)
        found = events_about(core, namespace, "bad", reason)
        return [e for e in found if "timeSlice" in e.message]

    (ev, *_) = wait_for(f"{reason} naming the bad field", config_refused, timeout=90)
    pod = core.read_namespaced_pod("bad", namespace)
    assert (ev.type, ev.involved_object.kind) == ("Warning", "Pod")
    assert ev.involved_object.uid == pod.metadata.uid
    assert (ev.source.component, ev.source.host) == ("kubelet", sim.name)
    assert ev.message.startswith("Failed to prepare dynamic resources: ")
    assert "invalid GpuConfig" in ev.message, ev.message
    assert pod.status.phase == "Pending"
    core.delete_namespaced_pod("bad", namespace)
    wait_for("bad pod gone", lambda: phase(core, namespace, "bad") == "Gone", timeout=60)


def test_critical_xid_reaches_pod_status_and_taints_the_gpu(  # keep last: the GPU stays sick
    nodes: dict[str, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    sim = nodes["4x-h100"]
    tmpl = template(resource_api, namespace, 1)
    gpu_pod(core, namespace, "sick", sim.name, tmpl)
    wait_for("sick pod Running", lambda: phase(core, namespace, "sick") == "Running", timeout=90)
    pod = core.read_namespaced_pod("sick", namespace)
    claim = resource_api.read_namespaced_resource_claim(
        pod.status.resource_claim_statuses[0].resource_claim_name, namespace
    )
    (result,) = claim.status.allocation.devices.results
    uuid = {d.name: d.attributes["uuid"].string for d in node_devices(resource_api, sim.name)}
    sim.host.nvml.queue_xid(uuid[result.device], 48)  # double-bit ECC error

    def unhealthy() -> list[str]:
        status = core.read_namespaced_pod("sick", namespace).status
        return [
            r.resource_id
            for cs in status.container_statuses or []
            for rs in cs.allocated_resources_status or []
            for r in rs.resources or []
            if r.health == "Unhealthy"
        ]

    # The kubelet's DRA manager (in the node agent) puts our health stream into pod status.
    ids = wait_for("the pod's device reported Unhealthy", unhealthy, timeout=60)
    # (named by the device's CDI ID, as the kubelet does)
    assert ids == [f"k8s.patchbay.dev/claim={claim.metadata.uid}-{result.device}"]
    # The scheduler no longer hands the GPU out: it carries a NoSchedule taint.
    taints = {
        d.name: [(t.key, t.effect) for t in d.taints or []]
        for d in node_devices(resource_api, sim.name)
    }
    assert taints[result.device] == [("patchbay.dev/unhealthy", "NoSchedule")]
    assert all(v == [] for k, v in taints.items() if k != result.device)
    # The plugin told the Node's Events (kubectl describe node).
    (ev,) = wait_for(
        "DeviceUnhealthy on the Node",
        lambda: events_about(core, "default", sim.name, "DeviceUnhealthy"),
        timeout=30,
    )
    assert (ev.type, ev.involved_object.kind) == ("Warning", "Node")
    assert ev.reporting_component == "patchbay.dev/plugin"
    assert f"critical XID 48 (reset class): {result.device} unhealthy" in ev.message, ev.message
