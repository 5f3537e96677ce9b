"""A device lease warns, expires and evicts on the real control plane (issue 37).

How: the chart's lease objects (the DeviceLeasePolicy CRD and the admission
policies) are applied to the real apiserver; a simulated node runs our
plugin with two mock GPUs; the controller runs with ``--device-leases`` and
the RBAC the chart grants it (hack/rbac/controller.yaml). Each test makes a
standalone claim with a short lease and a pod that uses it, then waits on
signals only: the claim's Events (LeaseStarted, LeaseExpiring,
LeaseExpired, LeaseEvictionBlocked), the pod gone, the claim gone; and
``kubectl patchbay leases`` shows the holder, reason and expiry. What is
asserted is order and content, never how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e import pods
from tests.e2e.admission import until_admitted, until_refused
from tests.e2e.helpers import events_about, unique, wait_for
from tests.e2e.kubectl_views import SCRIPT, kubectl_patchbay
from tests.e2e.lease_cluster import claim_gone, controller, leases, metric, reasons
from tests.e2e.plugin_nodes import plugin_node
from tests.harness.cluster import LocalCluster
from tests.harness.fabricsim import ControllerProcess
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster
__all__ = ["controller", "leases"]  # the shared fixtures

REASON, DURATION = "patchbay.dev/lease-reason", "patchbay.dev/lease-duration"
EXPIRY, HOLDER = "patchbay.dev/lease-expiry", "patchbay.dev/lease-holder"
GRACE = 1  # the policy's eviction grace period
SPEC = {
    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}
}


@pytest.fixture(scope="module")
def node(local_cluster: LocalCluster, resource_api: client.ResourceV1Api,
         core: client.CoreV1Api) -> Iterator[SimNode]:  # fmt: skip
    with plugin_node(local_cluster, resource_api, core, "lease", "2-gpus",
                     ready=lambda n: n == 2, what="two GPUs published") as sim:  # fmt: skip
        yield sim


@pytest.fixture
def team(core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str,
         leases: Any) -> Iterator[str]:  # fmt: skip
    """``namespace``, governed by a policy: 2s of warning, grace period GRACE;
    the policy in force at admission, and the holder recorded there (the
    apiserver loads both on their own time)."""
    label = name = unique("short")  # the policy is named as its namespaces' label
    core.patch_namespace(namespace, {"metadata": {"labels": {"lease-team": label}}})
    leases.create(body={
        "apiVersion": "patchbay.dev/v1alpha1", "kind": "DeviceLeasePolicy",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {"lease-team": label}},
                 "deviceClassNames": ["gpu.patchbay.dev"], "requireReason": True,
                 "maxDuration": "1h", "warningBefore": "15s",
                 "evictionGracePeriodSeconds": GRACE, "maxExtension": "1h",
                 "maxExtensionTotal": "90m", "extendGroups": ["ml-leads"]},
    })  # fmt: skip
    create = resource_api.create_namespaced_resource_claim
    until_refused(f"DeviceLeasePolicy {name}", f"DeviceLeasePolicy {name}:", create, namespace,
                  {"metadata": {"name": unique("probe")}, "spec": SPEC})  # fmt: skip
    until_admitted(
        "the lease holder recorded at admission", create, namespace,
        {"metadata": {"name": unique("probe"), "annotations": {REASON: "probe", DURATION: "10m"}},
         "spec": SPEC},
        check=lambda made: HOLDER in (made.metadata.annotations or {}),
    )  # fmt: skip
    yield namespace
    leases.delete(name=name)


def leased_pod(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, ns: str, node: SimNode,
    duration: str, labels: dict[str, str] | None = None, as_user: client.ApiClient | None = None,
) -> str:  # fmt: skip
    """A standalone claim with a ``duration`` lease (created ``as_user``) and a
    running pod using it; the claim's name."""
    name = unique("c")
    body = {"metadata": {"name": name, "annotations": {REASON: "e2e", DURATION: duration}},
            "spec": SPEC}  # fmt: skip
    (client.ResourceV1Api(as_user) if as_user else resource_api).create_namespaced_resource_claim(
        ns, body
    )
    pods.pod(core, ns, "p", node.name, {"resourceClaimName": name})
    if labels:
        core.patch_namespaced_pod("p", ns, {"metadata": {"labels": labels}})
    pods.running(core, ns, "p", alive=node.check_alive)
    return name


def test_a_lease_warns_then_evicts_at_expiry_and_the_claim_is_released(
    team: str, node: SimNode, controller: ControllerProcess, core: client.CoreV1Api,
    resource_api: client.ResourceV1Api, local_cluster: LocalCluster,
) -> None:  # fmt: skip
    claim = leased_pod(core, resource_api, team, node, "30s")
    wait_for("the lease stamped", lambda: "LeaseStarted" in reasons(core, team, claim), timeout=60)
    notes = resource_api.read_namespaced_resource_claim(claim, team).metadata.annotations
    (row,) = json.loads(kubectl_patchbay(local_cluster, "leases", "-n", team, "-o", "json"))
    assert (row["name"], row["reason"], row["expires"]) == (claim, "e2e", notes[EXPIRY])
    assert row["holder"] == notes[HOLDER] and row["devices"]
    wait_for("the pod warned", lambda: "LeaseExpiring" in reasons(core, team, "p"), timeout=60)
    assert "LeaseExpiring" in reasons(core, team, claim)
    wait_for("the pod evicted", lambda: pods.phase(core, team, "p") == "Gone", timeout=90)
    wait_for("the claim released and deleted", lambda: claim_gone(resource_api, team, claim),
             timeout=60)  # fmt: skip
    assert reasons(core, team, claim) == ["LeaseStarted", "LeaseExpiring", "LeaseExpired"]
    assert reasons(core, team, "p") == ["LeaseExpiring", "LeaseExpired"]
    (expired,) = events_about(core, team, claim, "LeaseExpired")
    assert f"grace period {GRACE}s" in expired.message and "claim is deleted" in expired.message
    assert metric(controller, "patchbay_device_lease_evictions_total") >= 1


def test_a_controller_killed_before_expiry_expires_the_lease_once_on_time(
    team: str, node: SimNode, controller: ControllerProcess, core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
) -> None:  # fmt: skip
    claim = leased_pod(core, resource_api, team, node, "40s")
    wait_for("the lease stamped", lambda: "LeaseStarted" in reasons(core, team, claim), timeout=60)
    notes = resource_api.read_namespaced_resource_claim(claim, team).metadata.annotations
    controller.kill()
    controller.start(identity="controller-1")  # takes the leader Lease once the old one lapses
    wait_for("the pod evicted", lambda: pods.phase(core, team, "p") == "Gone", timeout=120)
    wait_for("the claim deleted", lambda: claim_gone(resource_api, team, claim), timeout=60)
    expired = events_about(core, team, claim, "LeaseExpired")
    assert len(expired) == 1 and (expired[0].count or 1) == 1
    assert f"ended at {notes[EXPIRY]}" in expired[0].message  # the first stamp, not a new one
    assert reasons(core, team, claim).count("LeaseStarted") == 1


def test_a_pdb_that_blocks_the_eviction_is_reported_and_honoured(
    team: str, node: SimNode, controller: ControllerProcess, core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
) -> None:  # fmt: skip
    policy = client.PolicyV1Api(core.api_client)
    policy.create_namespaced_pod_disruption_budget(team, {
        "metadata": {"name": "keep"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "leased"}}},
    })  # fmt: skip
    leased_pod(core, resource_api, team, node, "20s", labels={"app": "leased"})
    wait_for("the blocked eviction reported",
             lambda: "LeaseEvictionBlocked" in reasons(core, team, "p"), timeout=90)  # fmt: skip
    pod = core.read_namespaced_pod("p", team)
    assert pod.metadata.deletion_timestamp is None  # honoured: never bypassed
    assert metric(controller, "patchbay_device_lease_evictions_blocked_total") >= 1
    policy.delete_namespaced_pod_disruption_budget("keep", team)
    wait_for("the pod evicted once the budget is gone",
             lambda: pods.phase(core, team, "p") == "Gone", timeout=150)  # fmt: skip
    with contextlib.suppress(ApiException):
        policy.delete_namespaced_pod_disruption_budget("keep", team)


def extend(cluster: LocalCluster, user: str, ns: str, claim: str, by: str) -> tuple[int, str]:
    """``kubectl patchbay lease extend`` as ``user`` (bound to ``edit``; carol in
    ml-leads, dave in ml-ops)."""
    groups = {"carol": ("ml-leads",), "dave": ("ml-ops",)}.get(user, ())
    kubeconfig = cluster.kubeconfig_for(user, user, groups)
    cmd = [str(SCRIPT), "--kubeconfig", str(kubeconfig), "-n", ns, "lease", "extend", claim,
           "--by", by, "--reason", f"{user} needs {by}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout + done.stderr


def test_an_extension_within_the_policy_is_applied_and_others_are_refused(
    team: str, node: SimNode, controller: ControllerProcess, core: client.CoreV1Api,
    resource_api: client.ResourceV1Api, local_cluster: LocalCluster, api_client: client.ApiClient,
) -> None:  # fmt: skip
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role_binding(team, {
        "metadata": {"name": "edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}
                     for u in ("alice", "bob", "carol", "dave")],
    })  # fmt: skip
    alice = config.new_client_from_config(
        config_file=str(local_cluster.kubeconfig_for("alice", "alice"))
    )
    try:
        claim = leased_pod(core, resource_api, team, node, "10m", as_user=alice)
    finally:
        alice.close()
    wait_for("the lease stamped", lambda: "LeaseStarted" in reasons(core, team, claim), timeout=60)

    def expiry() -> str:
        return str(
            resource_api.read_namespaced_resource_claim(claim, team).metadata.annotations[EXPIRY]
        )

    first = expiry()
    rc, out = extend(local_cluster, "alice", team, claim, "30m")  # the holder, within the policy
    assert rc == 0, out
    wait_for("the extension applied", lambda: expiry() != first, timeout=60)
    (extended,) = events_about(core, team, claim, "LeaseExtended")
    assert "alice extended the lease by 30m (30m in all): alice needs 30m" in extended.message
    rc, out = extend(local_cluster, "alice", team, claim, "2h")
    assert rc == 1 and "an extension by 2h is longer than spec.maxExtension 1h" in out
    rc, out = extend(local_cluster, "bob", team, claim, "10m")  # neither holder nor in the group
    assert (
        rc == 1
        and "bob may not extend this lease: only its holder alice and members of ml-leads" in out
    )
    rc, out = extend(local_cluster, "carol", team, claim, "45m")  # in the group
    assert rc == 0, out
    twice = lambda: len(events_about(core, team, claim, "LeaseExtended")) == 2  # noqa: E731
    wait_for("carol's extension applied", twice, timeout=60)
    # Who may "extend" the policy by RBAC may too: the apiserver's authorizer
    # asks (a SubjectAccessReview for dave and his groups) at admission.
    policy = core.read_namespace(team).metadata.labels["lease-team"]
    rc, out = extend(local_cluster, "dave", team, claim, "5m")
    assert rc == 1 and f"and who may 'extend' DeviceLeasePolicy {policy}" in out
    role = {"apiGroups": ["patchbay.dev"], "resources": ["deviceleasepolicies"],
            "resourceNames": [policy], "verbs": ["extend"]}  # fmt: skip
    rbac.create_cluster_role({"metadata": {"name": policy}, "rules": [role]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": policy},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": policy},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "ml-ops"}],
    })  # fmt: skip
    try:
        wait_for("dave's extension accepted once RBAC grants ml-ops 'extend'",
                 lambda: extend(local_cluster, "dave", team, claim, "5m")[0] == 0,
                 timeout=30)  # fmt: skip
        thrice = lambda: len(events_about(core, team, claim, "LeaseExtended")) == 3  # noqa: E731
        wait_for("dave's extension applied", thrice, timeout=60)
    finally:
        rbac.delete_cluster_role_binding(policy)
        rbac.delete_cluster_role(policy)
    rc, out = extend(local_cluster, "alice", team, claim, "30m")  # 110m in all: over 90m
    assert rc == 1 and "already would pass the cap of 90m" in out
    assert reasons(core, team, claim).count("LeaseExtensionRefused") == 0
