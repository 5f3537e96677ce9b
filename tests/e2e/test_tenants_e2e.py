"""Tenants on the real control plane: extended resources, quotas and
restricted classes (docs/tenants.md).

One simulated node with 2 GPUs, the node agent (the kubelet's DRA manager)
and a real plugin. An unchanged pod asking ``patchbay.dev/gpu: 1`` (or, with
the chart's override, ``nvidia.com/gpu: 1``) gets the claim the scheduler
makes, prepared by the agent through our socket; a ResourceQuota per class
refuses the third claim and caps extended-resource pods too; the chart's
ValidatingAdmissionPolicy keeps a class to labelled namespaces, the claims
the scheduler and the resourceclaim controller make included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.admission import refusal, until_refused
from tests.e2e.chart import Applier, by_kind, render
from tests.e2e.helpers import delete_quietly, events_about, unique, wait_for
from tests.e2e.pods import gone, phase, pod, running
from tests.e2e.tenants import (
    GPU_CLASS,
    assert_one_gpu_through_the_extended_claim,
    claim_body,
    limits_pod,
    start_node,
)
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TENANT = REPO / "deviceclasses" / "examples" / "tenant"


@pytest.fixture(scope="module")
def sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    yield from start_node(local_cluster, resource_api, core, "tenant")


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
        until_refused(
            "the restricted-class policy", denied, resource_api.create_namespaced_resource_claim,
            namespace, claim_body(unique("c"), cls), timeout=30,
        )  # fmt: skip
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
        pod(core, inside, "late", sim.name, "t")
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
