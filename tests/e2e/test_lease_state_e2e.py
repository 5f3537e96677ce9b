"""The holder is recorded at admission, and a lease's state is patchbay's alone (issue 37).

How: the chart's lease objects are applied to the real apiserver (the
MutatingAdmissionPolicy that records the holder, the ValidatingAdmissionPolicy
with failurePolicy Fail that guards the state). A user bound to the built-in
``edit`` ClusterRole in a namespace creates claims, a claim template and a
pod: the holder recorded is that user (whatever the object said); for the
pod's claim, made by the resource-claim controller, the creator recorded is
that controller and the holder pod its owner. The same user then fails to
set, change or remove the holder, holder pod, start, expiry, extension or
phase, on a claim, a template or the pod; the controller's identity (its
RBAC from hack/rbac/controller.yaml, as the chart grants it) may.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.e2e.admission import refusal, until_admitted, until_refused
from tests.e2e.chart import Applier, render
from tests.e2e.helpers import unique, wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.fabricsim import CONTROLLER_GROUP
from tests.harness.simnode import apply_rbac

pytestmark = pytest.mark.cluster

HOLDER, HOLDER_POD = "patchbay.dev/lease-holder", "patchbay.dev/lease-holder-pod"
STATE = ("patchbay.dev/lease-start", "patchbay.dev/lease-expiry", "patchbay.dev/lease-extended",
         "patchbay.dev/lease-phase", "patchbay.dev/lease-idle-noted")  # fmt: skip
KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
CLAIM_CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"
SPEC = {
    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}
}


def claim(name: str, **notes: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": notes}, "spec": SPEC}


def notes(obj: Any) -> dict[str, str]:
    return dict(obj.metadata.annotations or {})


@pytest.fixture
def guarded(helm: Path, applier: Applier, resource_api: client.ResourceV1Api,
            editor: client.ApiClient, namespace: str) -> None:  # fmt: skip
    """The chart's holder and lease-state policies applied and in force: each
    is a policy of its own and comes into force on its own time (a run saw
    alice's first change let through), so both are awaited."""
    for doc in render(helm, unique("pbs"), "default"):
        if doc["kind"] in KINDS and "lease-" in doc["metadata"]["name"]:
            applier.apply(doc, "default")
    until_admitted(
        "the lease holder recorded at admission", resource_api.create_namespaced_resource_claim,
        namespace, claim(unique("probe")), check=lambda made: HOLDER in notes(made),
    )  # fmt: skip
    stamped = claim(unique("probe"), **{STATE[1]: "2099-01-01T00:00:00Z"})
    until_refused(
        "the lease-state guard", "is written by patchbay only",
        client.ResourceV1Api(editor).create_namespaced_resource_claim, namespace, stamped,
    )  # fmt: skip


@pytest.fixture
def editor(local_cluster: LocalCluster, namespace: str, api_client: client.ApiClient
           ) -> Iterator[client.ApiClient]:  # fmt: skip
    """A client for user ``alice``, bound to the built-in ``edit`` ClusterRole in ``namespace``."""
    client.RbacAuthorizationV1Api(api_client).create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    })  # fmt: skip
    api = config.new_client_from_config(
        config_file=str(local_cluster.kubeconfig_for("alice", "alice"))
    )
    yield api
    api.close()


@pytest.fixture
def controller_api(local_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """A client for the controller's identity, with hack/rbac/controller.yaml's rights."""
    apply_rbac(local_cluster.kubeconfig, "controller.yaml")
    kubeconfig = local_cluster.kubeconfig_for(
        "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
    )
    api = config.new_client_from_config(config_file=str(kubeconfig))
    yield api
    api.close()


def test_the_holder_is_recorded_at_admission(
    guarded: None, editor: client.ApiClient, namespace: str, resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
) -> None:  # fmt: skip
    alice = client.ResourceV1Api(editor)
    made = alice.create_namespaced_resource_claim(namespace, claim("mine"))
    assert notes(made)[HOLDER] == "alice"
    # Whatever the object says: the admission records who asked.
    forged = alice.create_namespaced_resource_claim(namespace, claim("forged", **{HOLDER: "bob"}))
    assert notes(forged)[HOLDER] == "alice"
    # A pod's claim from a template: the resource-claim controller creates it,
    # so its holder pod is recorded, and the pod records its own creator.
    template: dict[str, Any] = {"metadata": {"name": "tmpl"}, "spec": {"spec": SPEC}}
    template["spec"]["metadata"] = {"annotations": {HOLDER_POD: "someone-elses"}}
    assert "written by patchbay only" in refusal(
        alice.create_namespaced_resource_claim_template, namespace, template
    )
    del template["spec"]["metadata"]
    alice.create_namespaced_resource_claim_template(namespace, template)
    pods = client.CoreV1Api(editor)
    pods.create_namespaced_pod(namespace, {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "main", "image": "pause", "resources": {"claims": [{"name": "dev"}]}}
            ],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "tmpl"}],
            "nodeSelector": {"patchbay.dev/lease-e2e": "no-such-node"},
        },
    })  # fmt: skip
    assert notes(core.read_namespaced_pod("p", namespace))[HOLDER] == "alice"
    holder_change = {"metadata": {"annotations": {HOLDER: "bob"}}}
    refused = refusal(pods.patch_namespaced_pod, "p", namespace, holder_change)
    assert f"the lease state of Pod {namespace}/p is written by patchbay only" in refused

    def made_for_pod() -> dict[str, str]:
        listed = resource_api.list_namespaced_resource_claim(namespace).items
        return next((notes(c) for c in listed if HOLDER_POD in notes(c)), {})

    recorded = wait_for("the pod's claim created", made_for_pod, timeout=60)
    assert recorded[HOLDER_POD] == "p" and recorded[HOLDER] == CLAIM_CONTROLLER
    # A claim that anyone else creates owned by that pod takes nothing from it.
    pod_uid = core.read_namespaced_pod("p", namespace).metadata.uid
    owned = claim("owned", **{HOLDER_POD: "p"})
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod_uid, "controller": True}
    ]
    refused = refusal(alice.create_namespaced_resource_claim, namespace, owned)
    assert f"[{HOLDER_POD}] may not be set or changed by alice" in refused
    del owned["metadata"]["annotations"][HOLDER_POD]
    assert HOLDER_POD not in notes(alice.create_namespaced_resource_claim(namespace, owned))


def test_a_user_with_edit_cannot_change_the_lease_state(
    guarded: None, editor: client.ApiClient, controller_api: client.ApiClient, namespace: str,
    resource_api: client.ResourceV1Api,
) -> None:  # fmt: skip
    alice = client.ResourceV1Api(editor)
    alice.create_namespaced_resource_claim(namespace, claim("c"))
    patch = alice.patch_namespaced_resource_claim
    for key, value in ((HOLDER, "bob"), (HOLDER, None), (HOLDER_POD, "p"),
                       *((k, "2099-01-01T00:00:00Z") for k in STATE)):  # fmt: skip
        message = refusal(patch, "c", namespace, {"metadata": {"annotations": {key: value}}})
        assert f"ResourceClaim {namespace}/c is written by patchbay only" in message, key
        assert f"metadata.annotations[{key}] may not be set or changed by alice" in message
    # Nor at creation, nor through a template's claims.
    stamped = claim("stamped", **{"patchbay.dev/lease-expiry": "2099-01-01T00:00:00Z"})
    assert "written by patchbay only" in refusal(
        alice.create_namespaced_resource_claim, namespace, stamped
    )
    template = {"metadata": {"name": "t"}, "spec": {"spec": SPEC, "metadata": {
        "annotations": {"patchbay.dev/lease-start": "2020-01-01T00:00:00Z"}}}}  # fmt: skip
    refused = refusal(alice.create_namespaced_resource_claim_template, namespace, template)
    assert "spec.metadata.annotations[patchbay.dev/lease-start]" in refused
    # Everything else stays alice's to change.
    patch("c", namespace, {"metadata": {"labels": {"team": "a"}, "annotations": {"x": "y"}}})
    assert notes(resource_api.read_namespaced_resource_claim("c", namespace))[HOLDER] == "alice"
    # The controller may write the state.
    ctl = client.ResourceV1Api(controller_api)
    state = {k: "2099-01-01T00:00:00Z" for k in STATE} | {HOLDER: "carol"}
    ctl.patch_namespaced_resource_claim("c", namespace, {"metadata": {"annotations": state}})
    assert notes(resource_api.read_namespaced_resource_claim("c", namespace))[HOLDER] == "carol"
