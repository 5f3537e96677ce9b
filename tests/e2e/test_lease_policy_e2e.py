"""Device lease policies refuse a claim at apply time, naming the policy and the field (issue 37).

How: the chart is rendered with the pinned helm and its lease objects (the
DeviceLeasePolicy CRD, the ValidatingAdmissionPolicy and its binding)
applied to the real apiserver, which then judges every claim and claim
template itself: no webhook of ours is involved. A policy selects a
namespace by label and one device class; claims in that namespace asking
for that class (directly or among firstAvailable choices) must give a
reason and may ask for at most the policy's maximum. Claims outside it
(another namespace, another class), claims that meet it, and updates that do
not touch the lease pass. A policy in audit mode (``spec.audit``) is judged
by the chart's second copy of the admission policy, bound with [Warn,
Audit]: the same claims are accepted, and the apiserver's warning names the
policy, its mode and the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.admission import refusal, until_refused
from tests.e2e.chart import Applier, render
from tests.e2e.discovery import dynamic_client
from tests.e2e.helpers import unique, wait_for
from tests.e2e.lease_cluster import apply_lease_objects

pytestmark = pytest.mark.cluster

REASON, DURATION = "patchbay.dev/lease-reason", "patchbay.dev/lease-duration"
LEASE_KINDS = {
    "CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}  # fmt: skip
POLICY: dict[str, Any] = {
    "apiVersion": "patchbay.dev/v1alpha1",
    "kind": "DeviceLeasePolicy",
    "spec": {
        "namespaceSelector": {"matchLabels": {"team": "notebooks"}},
        "deviceClassNames": ["gpu.patchbay.dev"],
        "requireReason": True,
        "defaultDuration": "4h",
        "maxDuration": "8h",
    },
}


def claim(name: str, cls: str = "gpu.patchbay.dev", **notes: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "annotations": notes},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
    }


@pytest.fixture
def policy(helm: Path, applier: Applier, api_client: client.ApiClient) -> Iterator[str]:
    """The chart's lease objects applied, and one DeviceLeasePolicy; its name."""
    policies = apply_lease_objects(helm, applier, api_client, LEASE_KINDS)
    name = unique("notebooks")
    policies.create(body={**POLICY, "metadata": {"name": name}})
    yield name
    policies.delete(name=name)


@pytest.fixture
def team(core: client.CoreV1Api, namespace: str) -> str:
    """``namespace``, labelled as the policy selects it."""
    core.patch_namespace(namespace, {"metadata": {"labels": {"team": "notebooks"}}})
    return namespace


def test_a_claim_that_breaks_a_lease_policy_is_refused_naming_it(
    policy: str, team: str, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    create = resource_api.create_namespaced_resource_claim
    # The policy takes effect once the apiserver's admission has its parameters
    # (until its REST mapper knows the new CRD it refuses with "failed to find
    # resource referenced by paramKind": docs/leases.md).
    unexplained = until_refused(
        "the lease policy", f"DeviceLeasePolicy {policy}:", create, team, claim(unique("c"))
    )
    assert f"DeviceLeasePolicy {policy}" in unexplained
    assert f"metadata.annotations[{REASON}] is required" in unexplained
    too_long = refusal(create, team, claim("long", **{REASON: "training", DURATION: "24h"}))
    assert f"DeviceLeasePolicy {policy}" in too_long
    assert f"[{DURATION}] 24h is longer than spec.maxDuration 8h" in too_long
    garbled = refusal(create, team, claim("garbled", **{REASON: "x", DURATION: "soon"}))
    assert f"[{DURATION}] soon is not a duration" in garbled
    # A firstAvailable choice of the class counts as asking for it.
    choices = claim("choices")
    choices["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "local", "deviceClassName": "local-gpu.patchbay.dev"},
        {"name": "any", "deviceClassName": "gpu.patchbay.dev"},
    ]}]  # fmt: skip
    assert f"[{REASON}] is required" in refusal(create, team, choices)
    # A template states it for its claims in spec.metadata.
    template: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {"spec": claim("x")["spec"]},
    }
    tmpl_refused = refusal(resource_api.create_namespaced_resource_claim_template, team, template)
    assert f"spec.metadata.annotations[{REASON}] is required" in tmpl_refused
    template["spec"]["metadata"] = {"annotations": {REASON: "notebook", DURATION: "2h"}}
    resource_api.create_namespaced_resource_claim_template(team, template)
    # What meets the policy, or is not governed by it, is accepted.
    create(team, claim("ok", **{REASON: "fine-tuning run 7", DURATION: "8h"}))
    create(team, claim("other-class", "mig-1g.patchbay.dev"))
    outside = core.create_namespace({"metadata": {"name": unique("other")}}).metadata.name
    try:
        create(outside, claim("elsewhere"))
    finally:
        core.delete_namespace(outside)
    # An update that leaves the lease alone (a label, the scheduler's
    # finalizer) is not judged; one that changes it is.
    resource_api.patch_namespaced_resource_claim("ok", team, {"metadata": {"labels": {"a": "b"}}})
    longer = {"metadata": {"annotations": {DURATION: "9h"}}}
    assert "is longer than spec.maxDuration" in refusal(
        resource_api.patch_namespaced_resource_claim, "ok", team, longer
    )


def test_a_malformed_policy_is_refused_naming_the_field(
    helm: Path, applier: Applier, api_client: client.ApiClient
) -> None:
    for doc in render(helm, unique("pbl"), "default"):
        if doc["kind"] == "CustomResourceDefinition":
            applier.apply(doc, "default")
    ext = client.ApiextensionsV1Api(api_client)
    wait_for(
        "the DeviceLeasePolicy CRD established",
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(
                "deviceleasepolicies.patchbay.dev"
            ).status.conditions
            or ()
        ),
        timeout=60,
    )
    policies = dynamic_client(api_client).resources.get(
        api_version="patchbay.dev/v1alpha1", kind="DeviceLeasePolicy"
    )
    bad = {**POLICY, "metadata": {"name": unique("bad")}}
    bad["spec"] = {**POLICY["spec"], "defaultDuration": "12h"}
    message = refusal(policies.create, body=bad)
    assert "spec.defaultDuration" in message and "maxDuration" in message
    bad["spec"] = {**POLICY["spec"], "maxDuration": "a week"}
    assert "spec.maxDuration" in refusal(policies.create, body=bad)
    # The extension, warning, idle and eviction fields (issue 37, step 2).
    for broken, field in (
        ({"maxExtension": "4h", "maxExtensionTotal": "2h"}, "spec.maxExtension"),
        ({"warningBefore": "8h"}, "spec.warningBefore"),
        ({"extendGroups": ["ml-leads"]}, "spec.extendGroups"),
        ({"evictionGracePeriodSeconds": -1}, "spec.evictionGracePeriodSeconds"),
        ({"idle": {"utilizationBelowPercent": 0, "for": "30m"}},
         "spec.idle.utilizationBelowPercent"),
        ({"idle": {"utilizationBelowPercent": 5, "for": "30m", "action": "Sometimes"}},
         "spec.idle.action"),
        ({"idle": {"utilizationBelowPercent": 5}}, "spec.idle.for"),
    ):  # fmt: skip
        bad["spec"] = {**POLICY["spec"], **broken}
        assert field in refusal(policies.create, body=bad), broken
    full = {**POLICY, "metadata": {"name": unique("full")}}
    full["spec"] = {
        **POLICY["spec"], "maxExtension": "2h", "maxExtensionTotal": "4h",
        "extendGroups": ["ml-leads"], "warningBefore": "15m", "evictionGracePeriodSeconds": 30,
        "idle": {"utilizationBelowPercent": 5, "for": "30m"},
    }  # fmt: skip
    made = policies.create(body=full).to_dict()
    try:  # the defaults the CRD fills in
        assert made["spec"]["holderMayExtend"] is True
        assert made["spec"]["idle"]["action"] == "Event"
    finally:
        policies.delete(name=full["metadata"]["name"])


def test_a_policy_in_audit_mode_warns_at_apply_time_and_refuses_nothing(
    helm: Path, applier: Applier, api_client: client.ApiClient, core: client.CoreV1Api,
    resource_api: client.ResourceV1Api, namespace: str,
) -> None:  # fmt: skip
    policies = apply_lease_objects(helm, applier, api_client, LEASE_KINDS)
    name = unique("audited")
    core.patch_namespace(namespace, {"metadata": {"labels": {"audit-team": name}}})
    policies.create(body={**POLICY, "metadata": {"name": name}, "spec": {
        **POLICY["spec"], "namespaceSelector": {"matchLabels": {"audit-team": name}},
        "audit": True,
    }})  # fmt: skip
    create = resource_api.create_namespaced_resource_claim_with_http_info

    def warned(body: dict[str, Any], **kwargs: Any) -> str:
        """The apiserver's warnings on creating ``body`` (it must be accepted)."""
        _, status, headers = create(namespace, body, **kwargs)
        assert status == 201
        return str(headers.get("Warning") or "")

    try:
        said = f"DeviceLeasePolicy {name} (audit mode: reported, not refused)"
        unexplained = wait_for(
            "the audit policy in force",
            lambda: warned(claim(unique("c")), dry_run="All"),
            timeout=60,
            done=lambda warning: said in warning,
        )
        assert f"metadata.annotations[{REASON}] is required" in unexplained
        assert warned(claim("no-reason")).count(f"[{REASON}] is required") == 1
        long = warned(claim("long", **{REASON: "training", DURATION: "24h"}))
        assert f"{said}: ResourceClaim {namespace}/long" in long
        assert f"[{DURATION}] 24h is longer than spec.maxDuration 8h" in long
        kept = resource_api.list_namespaced_resource_claim(namespace).items
        assert {c.metadata.name for c in kept} == {"no-reason", "long"}  # refused nothing
        assert warned(claim("fine", **{REASON: "training", DURATION: "2h"})) == ""
    finally:
        policies.delete(name=name)
