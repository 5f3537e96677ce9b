"""Tenants on the real control plane: extended resources, quotas, restricted
classes and admin access (docs/tenants.md).

One simulated node with 2 GPUs, the node agent (the kubelet's DRA manager)
and a real plugin. An unchanged pod asking ``patchbay.dev/gpu: 1`` (or, with
the chart's override, ``nvidia.com/gpu: 1``) gets the claim the scheduler
makes, prepared by the agent through our socket; a ResourceQuota per class
refuses the third claim; the chart's ValidatingAdmissionPolicy keeps a class
to labelled namespaces, claims the system makes included; an admin-access
claim views a GPU a running pod holds without disturbing it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import LocalCluster
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from simnode import SimNode, apply_deviceclasses, apply_plugin_rbac, build_nvml_mock

from tests.e2e.chart import Applier, by_kind, render
from tests.e2e.helpers import delete_quietly, events_about, unique, wait_for
from tests.e2e.test_plugin_e2e import node_devices, phase

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TENANT = REPO / "deviceclasses" / "examples" / "tenant"
GPU_CLASS = "gpu.patchbay.dev"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


@pytest.fixture(scope="module")
def sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    kubeconfig = local_cluster.kubeconfig_for(
        "patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",)
    )
    node = SimNode(local_cluster, unique("tenant"), "2-gpus", kubeconfig).start()
    try:

        def published() -> bool:
            node.check_alive()
            return len(node_devices(resource_api, node.name)) == 2

        wait_for("2 GPUs published", published, timeout=90)
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


@pytest.fixture(scope="module")
def mig_sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    """A second node, 2 x H100 with dynamic MIG (``--mig-gpus=all``)."""
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    kubeconfig = local_cluster.kubeconfig_for(
        "patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",)
    )
    node = SimNode(local_cluster, unique("tenant-mig"), "2-gpus", kubeconfig)
    node.plugin.extra_args = ("--mig-gpus=all",)
    node.start()
    try:

        def published() -> bool:
            node.check_alive()
            return len(node_devices(resource_api, node.name)) > 2

        wait_for("MIG devices published", published, timeout=90)
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


def limits_pod(core: client.CoreV1Api, ns: str, name: str, node: str, resource: str) -> None:
    """A device-plugin style pod: no claim, one extended resource in its limits."""
    container = {"name": "main", "image": "pause", "resources": {"limits": {resource: "1"}}}
    spec = {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container]}
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": spec})


def claim_pod(core: client.CoreV1Api, ns: str, name: str, node: str, **claim: str) -> None:
    container = {"name": "main", "image": "pause", "resources": {"claims": [{"name": "dev"}]}}
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [container],
        "resourceClaims": [{"name": "dev", **claim}],
    }
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": spec})


def running(core: client.CoreV1Api, ns: str, name: str) -> None:
    try:
        wait_for(f"pod {name} Running", lambda: phase(core, ns, name) == "Running", timeout=90)
    except pytest.fail.Exception:
        said = [f"{e.reason}: {e.message}" for e in events_about(core, ns, name)]
        pytest.fail(f"pod {name} is not Running; its events: {said}")


def gone(core: client.CoreV1Api, ns: str, name: str) -> None:
    core.delete_namespaced_pod(name, ns)
    wait_for(f"pod {name} gone", lambda: phase(core, ns, name) == "Gone", timeout=60)


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
    assert container["cdiDevices"] == [f"k8s.patchbay.dev/claim={uid}-{result.device}"]
    uuid_of = {d.name: d.attributes["uuid"].string for d in node_devices(resource_api, sim.name)}
    assert visible(container) == [uuid_of[result.device]]
    assert (sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").exists()


def test_a_limits_only_pod_gets_a_patchbay_gpu(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    limits_pod(core, namespace, "legacy", sim.name, "patchbay.dev/gpu")
    running(core, namespace, "legacy")
    assert_one_gpu_through_the_extended_claim(sim, resource_api, core, namespace, "legacy")
    special = core.read_namespaced_pod("legacy", namespace).status.extended_resource_claim_status
    uid = resource_api.read_namespaced_resource_claim(
        special.resource_claim_name, namespace
    ).metadata.uid
    gone(core, namespace, "legacy")
    assert not (sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").exists()


def test_the_charts_nvidia_name_serves_an_unchanged_device_plugin_pod(
    sim: SimNode,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
    helm: Path,
    applier: Applier,
) -> None:
    docs = render(
        helm,
        "patchbay",
        namespace,
        None,
        r"deviceClasses.extendedResourceNames.gpu\.patchbay\.dev=nvidia.com/gpu",
    )
    (gpu_class,) = [d for d in by_kind(docs, "DeviceClass") if d["metadata"]["name"] == GPU_CLASS]
    assert gpu_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    shipped = resource_api.read_device_class(GPU_CLASS)
    assert shipped.spec.extended_resource_name == "patchbay.dev/gpu"
    try:
        applier.apply(gpu_class, namespace)
        limits_pod(core, namespace, "unchanged", sim.name, "nvidia.com/gpu")
        running(core, namespace, "unchanged")
        assert_one_gpu_through_the_extended_claim(sim, resource_api, core, namespace, "unchanged")
        gone(core, namespace, "unchanged")
    finally:
        current = resource_api.read_device_class(GPU_CLASS)
        current.spec.extended_resource_name = "patchbay.dev/gpu"
        resource_api.replace_device_class(GPU_CLASS, current)


def quota_ready(core: client.CoreV1Api, ns: str, name: str) -> bool:
    quota = core.read_namespaced_resource_quota(name, ns)
    return bool(quota.status and quota.status.hard)


def test_the_tenant_quota_refuses_the_third_gpu(
    resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    quota = yaml.safe_load((TENANT / "quota.yaml").read_text())
    del quota["metadata"]["namespace"]
    core.create_namespaced_resource_quota(namespace, quota)
    name = quota["metadata"]["name"]
    wait_for("the quota controller's status", lambda: quota_ready(core, namespace, name))
    devices = f"{GPU_CLASS}.deviceclass.resource.k8s.io/devices"
    for i in range(2):
        resource_api.create_namespaced_resource_claim(namespace, claim_body(f"gpu-{i}"))
    with pytest.raises(ApiException) as refused:
        resource_api.create_namespaced_resource_claim(namespace, claim_body("gpu-2"))
    assert refused.value.status == 403
    body = json.loads(refused.value.body)["message"]
    assert f"exceeded quota: {name}" in body and f"limited: {devices}=2" in body, body
    # allocationMode All is charged as 32 devices, the most one claim can get.
    resource_api.delete_namespaced_resource_claim("gpu-1", namespace)
    wait_for(
        "one GPU freed in the quota",
        lambda: core.read_namespaced_resource_quota(name, namespace).status.used[devices] == "1",
    )
    with pytest.raises(ApiException) as everything:
        resource_api.create_namespaced_resource_claim(
            namespace, claim_body("all", allocationMode="All")
        )
    assert f"requested: {devices}=32" in json.loads(everything.value.body)["message"]
    # One MIG slice is one device, whatever its profile.
    mig = claim_body("mig", "mig.patchbay.dev", count=3)
    resource_api.create_namespaced_resource_claim(namespace, mig)
    migs = "mig.patchbay.dev.deviceclass.resource.k8s.io/devices"
    wait_for(
        "3 MIG slices used",
        lambda: (
            (core.read_namespaced_resource_quota(name, namespace).status.used or {}).get(migs)
            == "3"
        ),
    )


def labelled_namespace(core: client.CoreV1Api, labels: dict[str, str]) -> str:
    name = unique("tenant")
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_for(
        f"ServiceAccount default in {name}",
        lambda: (
            name
            in {sa.metadata.namespace for sa in core.list_namespaced_service_account(name).items}
        ),
        timeout=30,
    )
    return name


def refusal(create: Any) -> str:
    """The apiserver's message when ``create()`` is refused, "" when it succeeds."""
    try:
        create()
    except ApiException as exc:
        assert exc.status in (403, 422), exc.body
        return str(json.loads(exc.body)["message"])
    return ""


def test_a_restricted_class_only_in_labelled_namespaces(
    sim: SimNode,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
    helm: Path,
    applier: Applier,
) -> None:
    short = unique("restricted")
    cls, label, extended = (
        f"{short}.patchbay.dev",
        f"tenants.patchbay.dev/{short}",
        f"patchbay.dev/{short}",
    )
    gpu = 'device.driver == "patchbay.dev" && device.attributes["patchbay.dev"].type == "gpu"'
    resource_api.create_device_class(
        {
            "metadata": {"name": cls},
            "spec": {"selectors": [{"cel": {"expression": gpu}}], "extendedResourceName": extended},
        }
    )
    docs = render(
        helm,
        "patchbay",
        namespace,
        None,
        "restrictedDeviceClasses." + cls.replace(".", "\\.") + f"={label}",
    )
    policy = [d for d in docs if d["metadata"]["name"].endswith("-restricted-deviceclasses")]
    assert sorted(d["kind"] for d in policy) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    inside = labelled_namespace(core, {label: "true"})
    try:
        for doc in policy:
            applier.apply(doc, namespace)
        denied = (
            f"namespace {namespace} may not use DeviceClass {cls}: "
            f"the namespace needs the label {label}=true"
        )

        def claim_refused() -> str:
            msg = refusal(
                lambda: resource_api.create_namespaced_resource_claim(
                    namespace, claim_body(unique("c"), cls)
                )
            )
            return msg if denied in msg else ""

        wait_for("the policy in force", claim_refused, timeout=30)
        first_available = claim_body("fa", GPU_CLASS)
        first_available["spec"]["devices"]["requests"] = [
            {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": cls}]}
        ]
        assert denied in refusal(
            lambda: resource_api.create_namespaced_resource_claim(namespace, first_available)
        )
        template = {
            "metadata": {"name": "t"},
            "spec": {"spec": claim_body("t", cls)["spec"]},
        }
        assert denied in refusal(
            lambda: resource_api.create_namespaced_resource_claim_template(namespace, template)
        )
        # Other classes stay open; the labelled namespace may use this one.
        assert (
            refusal(
                lambda: resource_api.create_namespaced_resource_claim(namespace, claim_body("open"))
            )
            == ""
        )
        assert (
            refusal(
                lambda: resource_api.create_namespaced_resource_claim(inside, claim_body("ok", cls))
            )
            == ""
        )
        # The claim the scheduler makes for an extended resource is checked too.
        limits_pod(core, namespace, "outsider", sim.name, extended)
        (event, *_) = wait_for(
            "the scheduler's claim refused",
            lambda: [
                e for e in events_about(core, namespace, "outsider") if denied in (e.message or "")
            ],
            timeout=60,
        )
        assert event.reason == "FailedScheduling", event
        assert phase(core, namespace, "outsider") == "Pending"
        assert (
            core.read_namespaced_pod("outsider", namespace).status.extended_resource_claim_status
            is None
        )
        core.delete_namespaced_pod("outsider", namespace)
        limits_pod(core, inside, "insider", sim.name, extended)
        running(core, inside, "insider")
        assert_one_gpu_through_the_extended_claim(sim, resource_api, core, inside, "insider")
        gone(core, inside, "insider")
        # The claim the resourceclaim controller makes from a template: the
        # template was made while the namespace had the label, the pod after.
        resource_api.create_namespaced_resource_claim_template(inside, template)
        core.patch_namespace(inside, {"metadata": {"labels": {label: None}}})
        lost = denied.replace(namespace, inside)
        claim_pod(core, inside, "late", sim.name, resourceClaimTemplateName="t")
        (event, *_) = wait_for(
            "the controller's claim refused",
            lambda: [e for e in events_about(core, inside, "late") if lost in (e.message or "")],
            timeout=60,
        )
        assert event.reason == "FailedResourceClaimCreation", event
        assert phase(core, inside, "late") == "Pending"
        assert not core.read_namespaced_pod("late", inside).status.resource_claim_statuses
    finally:
        delete_quietly(core.delete_namespace, inside)
        delete_quietly(resource_api.delete_device_class, cls)


def test_admin_access_views_a_held_gpu_and_disturbs_nothing(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    resource_api.create_namespaced_resource_claim(namespace, claim_body("held"))
    claim_pod(core, namespace, "holder", sim.name, resourceClaimName="held")
    running(core, namespace, "holder")
    held = resource_api.read_namespaced_resource_claim("held", namespace)
    (result,) = held.status.allocation.devices.results
    uuid_of = {d.name: d.attributes["uuid"].string for d in node_devices(resource_api, sim.name)}
    uuid = uuid_of[result.device]
    held_spec = sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{held.metadata.uid}.json"
    held_before, record_before = held_spec.read_text(), container_record(sim, namespace, "holder")
    selector = {"cel": {"expression": f'device.attributes["patchbay.dev"].uuid == "{uuid}"'}}

    def view(name: str) -> Path:
        body = claim_body(name, selectors=[selector], adminAccess=True)
        resource_api.create_namespaced_resource_claim(namespace, body)
        claim_pod(core, namespace, name, sim.name, resourceClaimName=name)
        running(core, namespace, name)
        claim = resource_api.read_namespaced_resource_claim(name, namespace)
        (viewed,) = claim.status.allocation.devices.results
        assert viewed.device == result.device and viewed.admin_access
        assert visible(container_record(sim, namespace, name)) == [uuid]
        return sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{claim.metadata.uid}.json"

    view("monitor")
    assert held_spec.read_text() == held_before
    assert container_record(sim, namespace, "holder") == record_before
    gone(core, namespace, "monitor")
    assert phase(core, namespace, "holder") == "Running"
    assert held_spec.read_text() == held_before, "the view's unprepare left the holder alone"
    # And the other way round: the holder goes, the view stays as it was.
    spec = view("monitor-2")
    view_before = spec.read_text()
    gone(core, namespace, "holder")
    assert not held_spec.exists()
    assert spec.read_text() == view_before
    assert phase(core, namespace, "monitor-2") == "Running"
    gone(core, namespace, "monitor-2")


def test_the_quota_caps_extended_resource_pods_too(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    devices = f"{GPU_CLASS}.deviceclass.resource.k8s.io/devices"
    quota = {"metadata": {"name": "one-gpu"}, "spec": {"hard": {devices: "1"}}}
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for("the quota controller's status", lambda: quota_ready(core, namespace, "one-gpu"))
    limits_pod(core, namespace, "first", sim.name, "patchbay.dev/gpu")
    running(core, namespace, "first")
    # The node has a second GPU, but the claim the scheduler makes for this
    # pod would pass the namespace's cap: the apiserver refuses it.
    limits_pod(core, namespace, "second", sim.name, "patchbay.dev/gpu")
    (event, *_) = wait_for(
        "the scheduler's claim refused by the quota",
        lambda: [
            e
            for e in events_about(core, namespace, "second")
            if "exceeded quota: one-gpu" in (e.message or "")
        ],
        timeout=60,
    )
    assert event.reason == "FailedScheduling", event
    assert phase(core, namespace, "second") == "Pending"
    gone(core, namespace, "first")
    running(core, namespace, "second")
    gone(core, namespace, "second")


def mig_state(sim: SimNode) -> list[Any]:
    """Every GPU's MIG mode and instances, as the NVML mock holds them."""
    gpus = sorted(sim.host.nvml.read()["gpus"], key=lambda g: g["pci_bus_id"])
    return [(g["mig_current"], g["gpu_instances"]) for g in gpus]


def test_admin_access_to_mig_devices_never_changes_them(
    mig_sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    """Dynamic MIG partitions consume counters, and the 1.37.2 allocator checks
    counters for admin-access requests too (``checkAvailableCounters`` in
    k8s.io/dynamic-resource-allocation structured/internal/*/allocator_*.go):
    a view of a held partition is not allocated, and the holder runs on. A
    view of a partition nobody holds is allocated, and the plugin refuses it
    without creating the instance."""
    sim, ns = mig_sim, namespace
    core.patch_namespace(ns, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    profile = 'device.attributes["patchbay.dev"].profile == "1g.10gb"'
    held_body = claim_body("held", "mig.patchbay.dev", selectors=[{"cel": {"expression": profile}}])
    resource_api.create_namespaced_resource_claim(ns, held_body)
    claim_pod(core, ns, "holder", sim.name, resourceClaimName="held")
    running(core, ns, "holder")
    held = resource_api.read_namespaced_resource_claim("held", ns)
    (result,) = held.status.allocation.devices.results
    (dev,) = [d for d in node_devices(resource_api, sim.name) if d.name == result.device]
    parent, start = dev.attributes["parentUUID"].string, dev.attributes["placementStart"].int
    held_spec = sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{held.metadata.uid}.json"
    before, spec_before = mig_state(sim), held_spec.read_text()
    same = (
        f'{profile} && device.attributes["patchbay.dev"].parentUUID == "{parent}" && '
        f'device.attributes["patchbay.dev"].placementStart == {start}'
    )

    def view(name: str) -> None:
        body = claim_body(
            name, "mig.patchbay.dev", selectors=[{"cel": {"expression": same}}], adminAccess=True
        )
        resource_api.create_namespaced_resource_claim(ns, body)
        claim_pod(core, ns, name, sim.name, resourceClaimName=name)

    view("monitor")
    (event, *_) = wait_for(
        "the view of a held partition left unallocated",
        lambda: [
            e
            for e in events_about(core, ns, "monitor")
            if "cannot allocate all claims" in (e.message or "")
        ],
        timeout=60,
    )
    assert event.reason == "FailedScheduling"
    assert resource_api.read_namespaced_resource_claim("monitor", ns).status.allocation is None
    assert mig_state(sim) == before and held_spec.read_text() == spec_before
    assert phase(core, ns, "holder") == "Running"
    core.delete_namespaced_pod("monitor", ns)
    gone(core, ns, "holder")
    after = mig_state(sim)
    assert after != before, "the holder's instance went with it"
    view("nobody")
    (event, *_) = wait_for(
        "the view of a partition nobody holds refused",
        lambda: [
            e for e in events_about(core, ns, "nobody") if "is not created" in (e.message or "")
        ],
        timeout=60,
    )
    assert event.reason == "FailedPrepareDynamicResources", event
    assert mig_state(sim) == after, "admin access never creates a MIG instance"
    core.delete_namespaced_pod("nobody", ns)
