"""The controller's lease privileges are exactly what the lease clock needs (issue 37).

How: the chart is rendered with the pinned helm, the controller on and
``controller.deviceLeases`` on, and its ServiceAccount and roles applied to
the real apiserver. The apiserver's own authorizer (RBAC) then answers, by
SubjectAccessReview for that ServiceAccount, what it may do: evict pods
(``pods/eviction`` create), read an owner Pod, patch and delete claims,
patch their status, list and watch DeviceLeasePolicies and namespaces, and
``update`` the virtual ``deviceleases`` the lease-state policy asks about;
and what it may not: delete, create or change a pod itself (an eviction is
the only way, so a PodDisruptionBudget is never bypassed), touch a budget,
write a policy, create or replace a claim, and anything on Nodes beyond the
``list``/``watch`` the fabric pool had before leases. The same requests are
made for real as the ServiceAccount (impersonated): an eviction is
accepted, a pod delete and a Node patch are refused. With
``deviceLeases`` off, none of the lease rules is granted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e import pods
from tests.e2e.chart import Applier, render
from tests.e2e.helpers import delete_quietly, make_node, unique, wait_for
from tests.e2e.lease_cluster import leases
from tests.harness.cluster import LocalCluster

pytestmark = pytest.mark.cluster
__all__ = ["leases"]  # the shared fixture (the CRD, for the real list)

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
CONTROLLER = ("controller.enabled=true", "controller.token=t",
              "controller.fabricUrl=https://fabric.example",
              "controller.nodeSelector.patchbay\\.dev/helm-e2e=no-such-node")  # fmt: skip
# (verb, group, resource, subresource, name): what the lease clock needs.
NEEDED = [
    ("create", "", "pods", "eviction", ""),
    ("get", "", "pods", "", ""),
    ("patch", "resource.k8s.io", "resourceclaims", "", ""),
    ("delete", "resource.k8s.io", "resourceclaims", "", ""),
    ("patch", "resource.k8s.io", "resourceclaims", "status", ""),
    ("list", "patchbay.dev", "deviceleasepolicies", "", ""),
    ("watch", "patchbay.dev", "deviceleasepolicies", "", ""),
    ("list", "", "namespaces", "", ""),
    ("watch", "", "namespaces", "", ""),
    ("update", "patchbay.dev", "deviceleases", "", ""),
]
NEVER = [
    *((v, "", "pods", "", "") for v in ("create", "update", "patch", "delete", "deletecollection")),
    ("patch", "", "pods", "status", ""),
    *((v, "policy", "poddisruptionbudgets", "", "") for v in ("get", "update", "patch", "delete")),
    *((v, "patchbay.dev", "deviceleasepolicies", "", "")
      for v in ("get", "create", "update", "patch", "delete")),
    ("create", "resource.k8s.io", "resourceclaims", "", ""),
    ("update", "resource.k8s.io", "resourceclaims", "", ""),
    ("update", "resource.k8s.io", "resourceclaims", "status", ""),
    *((v, "", "nodes", "", "") for v in ("get", "create", "update", "patch", "delete")),
    *((v, "", "nodes", "status", "") for v in ("update", "patch")),
    ("update", "", "namespaces", "", ""),
]  # fmt: skip


def allowed(authz: client.AuthorizationV1Api, user: str, ns: str, ask: tuple[str, ...]) -> bool:
    """The apiserver's authorizer on ``ask`` (verb, group, resource, subresource, name)."""
    verb, group, resource, sub, name = ask
    attrs = {"verb": verb, "group": group, "resource": resource, "subresource": sub,
             "name": name, "namespace": "" if resource in ("nodes", "namespaces",
             "deviceleasepolicies", "deviceleases") else ns}  # fmt: skip
    sa_ns = user.split(":")[2]
    review = authz.create_subject_access_review({"spec": {
        "user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}",
                                 "system:authenticated"],
        "resourceAttributes": attrs,
    }})  # fmt: skip
    return bool(review.status.allowed)


def applied_controller(helm: Path, applier: Applier, ns: str, *sets: str) -> str:
    """The chart's controller ServiceAccount and roles applied; the SA's user name."""
    docs = render(helm, unique("pbr"), ns, None, *CONTROLLER, *sets)
    for doc in docs:
        if doc["kind"] in RBAC_KINDS and "controller" in doc["metadata"]["name"]:
            applier.apply(doc, ns)
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"
             and "controller" in d["metadata"]["name"]]  # fmt: skip
    return f"system:serviceaccount:{ns}:{sa['metadata']['name']}"


@pytest.fixture
def as_user(local_cluster: LocalCluster) -> Iterator[Any]:
    made: list[client.ApiClient] = []

    def impersonating(user: str) -> client.ApiClient:
        api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
        api.default_headers["Impersonate-User"] = user
        made.append(api)
        return api

    yield impersonating
    for api in made:
        api.close()


def test_the_controller_may_evict_and_patch_claims_and_nothing_on_nodes(
    helm: Path, namespace: str, applier: Applier, api_client: client.ApiClient,
    core: client.CoreV1Api, leases: Any, as_user: Any,
) -> None:  # fmt: skip
    """(``leases``: the DeviceLeasePolicy CRD, so that the list below is real.)"""
    user = applied_controller(helm, applier, namespace, "controller.deviceLeases=true")
    authz = client.AuthorizationV1Api(api_client)
    wait_for("the chart's roles in force", lambda: allowed(authz, user, namespace, NEEDED[0]),
             timeout=30)  # fmt: skip
    missing = [ask for ask in NEEDED if not allowed(authz, user, namespace, ask)]
    assert missing == [], f"the lease clock lacks {missing}"
    granted = [ask for ask in NEVER if allowed(authz, user, namespace, ask)]
    assert granted == [], f"the controller may {granted}"
    # The Nodes' verbs are the fabric pool's, as before leases: list and watch.
    assert allowed(authz, user, namespace, ("list", "", "nodes", "", ""))

    # The same for real, as the ServiceAccount.
    me = as_user(user)
    pods.pod(core, namespace, "victim", None, {"resourceClaimName": "none"})  # never scheduled
    with pytest.raises(ApiException) as deleted:
        client.CoreV1Api(me).delete_namespaced_pod("victim", namespace)
    assert deleted.value.status == 403
    client.CoreV1Api(me).create_namespaced_pod_eviction("victim", namespace, {
        "metadata": {"name": "victim", "namespace": namespace}, "deleteOptions": {},
    })  # fmt: skip
    wait_for("the pod evicted", lambda: pods.phase(core, namespace, "victim") == "Gone",
             timeout=30)  # fmt: skip
    node = unique("rbac-node")
    make_node(core, node)
    try:
        with pytest.raises(ApiException) as patched:
            client.CoreV1Api(me).patch_node(node, {"metadata": {"labels": {"taken": "yes"}}})
        assert patched.value.status == 403
    finally:
        delete_quietly(core.delete_node, node)
    listed = client.CustomObjectsApi(me).list_cluster_custom_object(
        "patchbay.dev", "v1alpha1", "deviceleasepolicies"
    )
    assert "items" in listed


def test_without_device_leases_the_chart_grants_none_of_the_lease_rules(
    helm: Path, namespace: str, applier: Applier, api_client: client.ApiClient
) -> None:
    user = applied_controller(helm, applier, namespace, "controller.deviceLeases=false")
    authz = client.AuthorizationV1Api(api_client)
    wait_for("the chart's roles in force",
             lambda: allowed(authz, user, namespace, ("list", "", "nodes", "", "")),
             timeout=30)  # fmt: skip
    granted = [ask for ask in NEEDED if allowed(authz, user, namespace, ask)]
    # resourceclaims/status patch is the fabric binding conditions', granted either way.
    assert granted == [("patch", "resource.k8s.io", "resourceclaims", "status", "")]
