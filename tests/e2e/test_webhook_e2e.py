"""The admission webhook for our opaque configs on the real control plane (docs/webhook.md).

The real ``patchbay-controller`` serves the webhook on loopback over TLS
with a certificate from a CA this module makes (tests/harness/cluster_pki), as a
follower (the leader Lease it is given is not one its RBAC grants: every
replica serves the webhook, not only the leader); the
chart's own ValidatingWebhookConfiguration (``helm template``, rules,
matchCondition and all) is registered with ``clientConfig.url`` pointing
there and that CA as its bundle, scoped to the test's namespace. The real
apiserver then refuses a claim and a template whose ``GpuConfig`` has an
unknown field, naming it, and admits good configs and other drivers'. With
the process stopped, ``failurePolicy`` decides (Fail refuses, Ignore
admits), and the scheduler still allocates a claim and the pod runs: the
finalizer update and the status write never depend on the webhook.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.admission import until_admitted, until_refused
from tests.e2e.chart import by_kind, render
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.plugin_nodes import plugin_node
from tests.e2e.pods import pod, running
from tests.harness.cluster import LocalCluster, bin_dir
from tests.harness.cluster_pki import Pki
from tests.harness.cluster_proc import free_port
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService
from tests.harness.simnode import SimNode, apply_rbac

pytestmark = pytest.mark.cluster
DENIED = 'admission webhook "opaque-configs.patchbay.dev" denied the request'
GOOD = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "GpuConfig"}
TYPO = {**GOOD, "driverCapabilites": ["compute"]}  # sic: the field a user misspelt


class Webhook:
    def __init__(self, ctl: ControllerProcess, port: int, ca: Path) -> None:
        self.ctl, self.port, self.ca = ctl, port, ca
        self.url = f"https://127.0.0.1:{port}/validate"

    def answers(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/healthz", timeout=2, context=ctx
            ) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def up(self) -> None:
        if not self.ctl.alive:
            self.ctl.start()
        wait_for("the webhook answering", lambda: self.alive() and self.answers(), timeout=60)

    def alive(self) -> bool:
        if not self.ctl.alive:
            raise RuntimeError(f"controller exited:\n{self.ctl.log_tail()}")
        return True


@pytest.fixture(scope="module")
def webhook(
    local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Webhook]:
    apply_rbac(local_cluster.kubeconfig, "controller.yaml")
    run = tmp_path_factory.mktemp("webhook")
    pki = Pki(run / "pki")
    pki.init()
    cert = pki.issue("webhook", "patchbay-webhook", server_sans=("IP:127.0.0.1",))
    fabric = FabricService(run / "fabric", {"switches": []})
    kubeconfig = local_cluster.kubeconfig_for(
        "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
    )
    port = free_port()
    ctl = ControllerProcess(
        kubeconfig, fabric, Path(local_cluster.run_dir) / "logs" / "controller-webhook.log",
        # A Lease its RBAC does not grant: it stays a follower, which serves admission too.
        f"--lease-name={unique('webhook-lease')}",
        f"--fabric-pool={unique('webhook-pool')}",
        f"--webhook-port={port}", f"--webhook-tls-cert={cert.cert}",
        f"--webhook-tls-key={cert.key}",
    )  # fmt: skip
    hook = Webhook(ctl, port, pki.ca.cert)
    try:
        fabric.start()
        hook.up()
        yield hook
    finally:
        ctl.stop()
        fabric.stop()


@pytest.fixture
def register(
    webhook: Webhook, helm: Path, api_client: client.ApiClient, namespace: str
) -> Iterator[Any]:
    """``register(policy)``: the chart's registration, pointed at the process
    and scoped to this test's namespace, with failurePolicy ``policy``."""
    api = client.AdmissionregistrationV1Api(api_client)
    docs = render(helm, "rel", "patchbay", None, "controller.enabled=true",
                  "controller.fabricUrl=https://fabric", "controller.token=t",
                  "webhook.enabled=true")  # fmt: skip
    (vwc,) = by_kind(docs, "ValidatingWebhookConfiguration")
    name = unique("patchbay-webhook")
    vwc["metadata"] = {"name": name}
    (hook,) = vwc["webhooks"]
    hook["clientConfig"] = {
        "url": webhook.url,
        "caBundle": base64.b64encode(webhook.ca.read_bytes()).decode(),
    }
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}

    def apply(policy: str) -> None:
        hook["failurePolicy"] = policy
        with contextlib.suppress(ApiException):
            api.delete_validating_webhook_configuration(name)
        api.create_validating_webhook_configuration(vwc)

    yield apply
    delete_quietly(api.delete_validating_webhook_configuration, name)


def claim(name: str, parameters: dict[str, Any], driver: str = "patchbay.dev") -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}
    config = {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request], "config": [config]}},
    }


def test_a_claim_with_an_unknown_field_is_refused_naming_it(
    register: Any, resource_api: client.ResourceV1Api, namespace: str,
    local_cluster: LocalCluster, tmp_path: Path,
) -> None:  # fmt: skip
    register("Fail")
    body = claim("typo", TYPO)
    # The registration reaches the apiserver's webhook informer within moments;
    # refused as Invalid (422), no other status.
    message = until_refused(
        "the webhook", DENIED, resource_api.create_namespaced_resource_claim, namespace, body,
        statuses=(422,), timeout=30,
    )  # fmt: skip
    print(message)
    assert f"ResourceClaim {namespace}/typo: spec.devices.config[0] (requests: gpu)" in message
    assert "invalid GpuConfig: field driverCapabilites: Extra inputs are not permitted" in message
    # What a user sees from kubectl apply.
    manifest = tmp_path / "claim.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                        "metadata": {"name": "typo", "namespace": namespace},
                                        "spec": body["spec"]}))  # fmt: skip
    kubectl = [str(bin_dir() / "kubectl"), f"--kubeconfig={local_cluster.kubeconfig}"]
    proc = subprocess.run([*kubectl, "apply", "-f", str(manifest)], capture_output=True, text=True)
    print(proc.stderr)
    assert proc.returncode != 0 and DENIED in proc.stderr
    assert "field driverCapabilites" in proc.stderr
    # A good config and another driver's (however odd) are admitted.
    resource_api.create_namespaced_resource_claim(namespace, claim("good", GOOD))
    odd = claim("other", {"driverCapabilites": 1}, driver="gpu.nvidia.com")
    resource_api.create_namespaced_resource_claim(namespace, odd)


def test_a_template_with_an_unknown_field_is_refused_naming_it(
    register: Any, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    register("Fail")
    bad = {"metadata": {"name": "tmpl"}, "spec": {"spec": claim("x", TYPO)["spec"]}}
    message = until_refused(
        "the webhook", DENIED, resource_api.create_namespaced_resource_claim_template, namespace,
        bad, statuses=(422,), timeout=30,
    )  # fmt: skip
    assert f"ResourceClaimTemplate {namespace}/tmpl: spec.spec.devices.config[0]" in message
    assert "field driverCapabilites" in message
    good = {"metadata": {"name": "tmpl"}, "spec": {"spec": claim("x", GOOD)["spec"]}}
    resource_api.create_namespaced_resource_claim_template(namespace, good)


@pytest.fixture(scope="module")
def node(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    with plugin_node(local_cluster, resource_api, core, "webhook", "2-gpus") as sim:
        yield sim


def test_with_the_webhook_down_failure_policy_decides_and_allocation_goes_on(
    webhook: Webhook, register: Any, node: SimNode, resource_api: client.ResourceV1Api,
    core: client.CoreV1Api, namespace: str,
) -> None:  # fmt: skip
    create = resource_api.create_namespaced_resource_claim
    register("Fail")
    until_refused("the webhook", DENIED, create, namespace, claim("probe", TYPO),
                  statuses=(422,), timeout=30)  # fmt: skip
    create(namespace, claim("held", GOOD))  # admitted while the webhook is up
    webhook.ctl.stop()
    try:
        # With failurePolicy Fail and the webhook down: an Internal Error (500).
        until_refused(
            "the registration with the webhook down",
            'failed calling webhook "opaque-configs.patchbay.dev"',
            create, namespace, claim("down", GOOD), statuses=(500,), timeout=30,
        )  # fmt: skip
        # The scheduler adds its finalizer (an UPDATE, skipped by the
        # matchCondition) and writes the allocation (resourceclaims/status,
        # never registered): the pod runs while the webhook is down.
        pod(core, namespace, "user", node.name, {"resourceClaimName": "held"})
        running(core, namespace, "user")
        held = resource_api.read_namespaced_resource_claim("held", namespace)
        assert held.status.allocation is not None
        assert "resource.kubernetes.io/delete-protection" in (held.metadata.finalizers or [])

        register("Ignore")
        until_admitted(
            "a claim admitted unchecked with failurePolicy Ignore", create, namespace,
            claim("unchecked", TYPO), statuses=(500,), timeout=30,
        )  # fmt: skip
    finally:
        webhook.up()
