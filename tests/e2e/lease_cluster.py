"""The device lease clock on the real control plane: what its e2e modules share.

Why a module: the expiry tests (``test_lease_expiry_e2e``) and the idle
reclaim tests (``test_idle_reclaim_e2e``) both need the chart's lease
objects applied (the DeviceLeasePolicy CRD and the admission policies), the
controller running with ``--device-leases`` and the RBAC the chart grants it
(hack/rbac/controller.yaml), and the same reads: the lease Events of an
object, whether a claim is gone, a controller metric.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.chart import Applier, render
from tests.e2e.discovery import dynamic_client
from tests.e2e.helpers import events_about, unique, wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.cluster_proc import free_port
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService
from tests.harness.simnode import apply_rbac

LEASE_KINDS = {"CustomResourceDefinition", "ValidatingAdmissionPolicy",
               "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
               "MutatingAdmissionPolicyBinding"}  # fmt: skip


def apply_lease_objects(
    helm: Path, applier: Applier, api_client: client.ApiClient,
    kinds: Collection[str] = frozenset(LEASE_KINDS),
) -> Any:  # fmt: skip
    """The chart's lease objects of ``kinds`` applied (the CRD, the admission
    policies) and the CRD established; the DeviceLeasePolicy resource."""
    for doc in render(helm, unique("pbx"), "default"):
        if doc["kind"] in kinds:
            applier.apply(doc, "default")
    ext = client.ApiextensionsV1Api(api_client)

    def established() -> bool:
        crd = ext.read_custom_resource_definition("deviceleasepolicies.patchbay.dev")
        return any(c.type == "Established" and c.status == "True"
                   for c in crd.status.conditions or ())  # fmt: skip

    wait_for("the DeviceLeasePolicy CRD established", established, timeout=60)
    return dynamic_client(api_client).resources.get(
        api_version="patchbay.dev/v1alpha1", kind="DeviceLeasePolicy"
    )


@pytest.fixture(scope="module")
def leases(helm: Path, api_client: client.ApiClient) -> Iterator[Any]:
    """The chart's lease objects applied; the DeviceLeasePolicy resource."""
    applier = Applier(api_client)
    try:
        yield apply_lease_objects(helm, applier, api_client)
    finally:
        applier.cleanup()


@pytest.fixture(scope="module")
def controller(local_cluster: LocalCluster, leases: Any) -> Iterator[ControllerProcess]:
    """The controller with the device lease clock on (a fabric with no devices)."""
    apply_rbac(local_cluster.kubeconfig, "controller.yaml")
    run = Path(local_cluster.run_dir)
    fabric = FabricService(run / "lease-fabric", {"switches": []}).start()
    kubeconfig = local_cluster.kubeconfig_for(
        "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
    )
    ctl = ControllerProcess(
        kubeconfig, fabric, run / "logs" / "lease-controller.log", "--device-leases=true",
        "--lease-duration=6", f"--metrics-port={free_port()}",
    )  # fmt: skip
    try:
        yield ctl.start()
    finally:
        ctl.stop()
        fabric.stop()


def reasons(core: client.CoreV1Api, ns: str, name: str, prefix: str = "Lease") -> list[str]:
    """The reasons of the Events about ``name`` that start with ``prefix``, oldest first."""
    return [str(e.reason) for e in events_about(core, ns, name) if e.reason.startswith(prefix)]


def claim_gone(resource_api: client.ResourceV1Api, ns: str, name: str) -> bool:
    try:
        resource_api.read_namespaced_resource_claim(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def metric(ctl: ControllerProcess, name: str) -> float:
    (arg,) = [a for a in ctl.extra if a.startswith("--metrics-port=")]
    url = f"http://127.0.0.1:{arg.split('=', 1)[1]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        families = list(text_string_to_metric_families(r.read().decode()))
    return sum(s.value for f in families for s in f.samples if s.name == name)
