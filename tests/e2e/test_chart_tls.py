"""The chart serves the fabric API over TLS from one CA (helm template, no
cluster): by default it makes the CA and the fabric's certificate (valid
for the Service's DNS name the controller checks), the fabric serves them,
the controller verifies against the CA; ``tls.secretName`` brings one's
own; ``controller.fabricInsecure`` is plain HTTP on both ends. The
admission webhook (``webhook.enabled``) is served with a certificate from
the same CA, whose bundle is the registration's caBundle, and registered
as docs/webhook.md says (never on resourceclaims/status)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.chart import CHART, by_kind, render, run_helm

pytestmark = pytest.mark.cluster
BASE = [
    "controller.enabled=true",
    "fabric.enabled=true",
    "fabric.topology.fabrics=null",
]


def _env(docs: list[Any], deployment: str) -> dict[str, str]:
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == deployment]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e.get("value", "")) for e in container.get("env") or []}


def _secrets(docs: list[Any], deployment: str) -> set[str]:
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == deployment]
    vols = dep["spec"]["template"]["spec"]["volumes"]
    return {v["secret"]["secretName"] for v in vols if "secret" in v}


def test_default_is_tls_from_the_charts_own_ca(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE)
    tls_secrets = {
        s["metadata"]["name"]: s
        for s in by_kind(docs, "Secret")
        if s["type"] == "kubernetes.io/tls"
    }
    # The serving pair, and the CA that signs it (kept, never mounted: _tls.tpl).
    assert set(tls_secrets) == {"rel-patchbay-tls", "rel-patchbay-tls-ca"}
    tls = tls_secrets["rel-patchbay-tls"]
    assert tls["data"]["ca.crt"] == tls_secrets["rel-patchbay-tls-ca"]["data"]["tls.crt"]
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(tls["data"][key]))
    fabric, ctl = _env(docs, "rel-patchbay-fabric"), _env(docs, "rel-patchbay-controller")
    assert fabric["FABRIC_TLS_CERT"].endswith("/tls.crt") and fabric["FABRIC_INSECURE"] == "false"
    assert ctl["FABRIC_URL"].startswith("https://") and ctl["FABRIC_INSECURE"] == "false"
    assert ctl["FABRIC_CA_BUNDLE"].endswith("/ca.crt")
    assert "rel-patchbay-tls" in _secrets(docs, "rel-patchbay-fabric")
    assert "rel-patchbay-tls" in _secrets(docs, "rel-patchbay-controller")
    # The name the controller checks is one the certificate carries, from that CA.
    name = ctl["FABRIC_SERVER_NAME"]
    assert name == "rel-patchbay-fabric.ns1.svc"
    ok = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname", name,
         str(tmp_path / "tls.crt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname",
         "fabric.example.com", str(tmp_path / "tls.crt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert wrong.returncode != 0


def test_a_secret_of_ones_own_is_used_by_both_ends(helm: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE, "tls.secretName=corp-ca")
    assert [s for s in by_kind(docs, "Secret") if s.get("type") == "kubernetes.io/tls"] == []
    assert "corp-ca" in _secrets(docs, "rel-patchbay-fabric")
    assert "corp-ca" in _secrets(docs, "rel-patchbay-controller")
    assert _env(docs, "rel-patchbay-controller")["FABRIC_URL"].startswith("https://")


def test_plain_http_only_when_told_on_both_ends(helm: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE, "controller.fabricInsecure=true")
    assert [s for s in by_kind(docs, "Secret") if s.get("type") == "kubernetes.io/tls"] == []
    fabric, ctl = _env(docs, "rel-patchbay-fabric"), _env(docs, "rel-patchbay-controller")
    assert fabric["FABRIC_INSECURE"] == ctl["FABRIC_INSECURE"] == "true"
    assert "FABRIC_TLS_CERT" not in fabric and "FABRIC_CA_BUNDLE" not in ctl
    assert ctl["FABRIC_URL"].startswith("http://")


WEBHOOK = [*BASE, "webhook.enabled=true"]


def _write(tmp_path: Path, secret: dict[str, Any], *keys: str) -> None:
    for key in keys:
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))


def _verifies(tmp_path: Path, name: str, ca: str = "ca.crt") -> bool:
    ok = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / ca), "-verify_hostname", name,
         str(tmp_path / "tls.crt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return ok.returncode == 0


def test_the_webhook_is_served_with_the_same_ca(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *WEBHOOK)
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    serving, ca = secrets["rel-patchbay-tls"], secrets["rel-patchbay-tls-ca"]
    (vwc,) = by_kind(docs, "ValidatingWebhookConfiguration")
    (hook,) = vwc["webhooks"]
    # One CA: the serving Secret's ca.crt, the CA Secret's and the caBundle are one.
    assert hook["clientConfig"]["caBundle"] == serving["data"]["ca.crt"] == ca["data"]["tls.crt"]
    _write(tmp_path, serving, "ca.crt", "tls.crt")
    for name in ("rel-patchbay-webhook.ns1.svc", "rel-patchbay-fabric.ns1.svc"):
        assert _verifies(tmp_path, name), name
    assert not _verifies(tmp_path, "webhook.example.com")
    assert hook["clientConfig"]["service"] == {
        "namespace": "ns1", "name": "rel-patchbay-webhook", "path": "/validate", "port": 443,
    }  # fmt: skip
    (svc,) = [
        s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "rel-patchbay-webhook"
    ]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "controller"
    assert svc["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook"}]
    # Every replica serves it, from the Secret, on its one port setting.
    ctl = _env(docs, "rel-patchbay-controller")
    assert ctl["WEBHOOK_PORT"] == "9443"
    assert ctl["WEBHOOK_TLS_CERT"] == "/etc/patchbay-webhook-tls/tls.crt"
    assert ctl["WEBHOOK_TLS_KEY"] == "/etc/patchbay-webhook-tls/tls.key"
    assert "rel-patchbay-tls" in _secrets(docs, "rel-patchbay-controller")
    (dep,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("controller")
    ]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "webhook", "containerPort": 9443} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/healthz", "port": "webhook", "scheme": "HTTPS",
    }  # fmt: skip
    # A re-issued certificate restarts the pods that load it.
    names = serving["metadata"]["annotations"]["patchbay.dev/tls-names"]
    assert dep["spec"]["template"]["metadata"]["annotations"]["patchbay.dev/tls-names"] == names


def test_the_webhook_registration(helm: Path) -> None:
    (vwc,) = by_kind(render(helm, "rel", "ns1", None, *WEBHOOK), "ValidatingWebhookConfiguration")
    (hook,) = vwc["webhooks"]
    (rule,) = hook["rules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    # Never resourceclaims/status: a webhook that is down must not block allocation.
    assert rule["resources"] == ["resourceclaims", "resourceclaimtemplates"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert hook["failurePolicy"] == "Ignore" and hook["namespaceSelector"] == {}
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] == 5
    # The scheduler's finalizer update (spec unchanged) is never sent.
    (cond,) = hook["matchConditions"]
    assert "object.spec != oldObject.spec" in cond["expression"]
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}
    docs = render(
        helm, "rel", "ns1", None, *WEBHOOK, "webhook.failurePolicy=Fail",
        "webhook.timeoutSeconds=2", "webhook.namespaceSelector.matchExpressions[0].key=team",
        "webhook.namespaceSelector.matchExpressions[0].operator=In",
        "webhook.namespaceSelector.matchExpressions[0].values[0]=a",
    )  # fmt: skip
    (hook,) = by_kind(docs, "ValidatingWebhookConfiguration")[0]["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 2
    assert hook["namespaceSelector"] == selector


def test_without_the_webhook_nothing_of_it_is_rendered(helm: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE)
    assert by_kind(docs, "ValidatingWebhookConfiguration") == []
    assert "rel-patchbay-webhook" not in {s["metadata"]["name"] for s in by_kind(docs, "Service")}
    assert not [k for k in _env(docs, "rel-patchbay-controller") if k.startswith("WEBHOOK_")]


def test_the_webhook_alone_gets_a_certificate_for_its_service(helm: Path, tmp_path: Path) -> None:
    # No fabric in the chart (the controller talks to a real one): the chart's TLS is the webhook's.
    docs = render(
        helm, "rel", "ns1", None, "controller.enabled=true", "controller.token=t",
        "controller.fabricUrl=https://fabric.example.com", "webhook.enabled=true",
    )  # fmt: skip
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    _write(tmp_path, secrets["rel-patchbay-tls"], "ca.crt", "tls.crt")
    assert _verifies(tmp_path, "rel-patchbay-webhook.ns1.svc")
    assert not _verifies(tmp_path, "rel-patchbay-fabric.ns1.svc")
    # The controller verifies the real fabric against the system's trust store, not this CA.
    assert "FABRIC_CA_BUNDLE" not in _env(docs, "rel-patchbay-controller")


def test_the_webhook_with_a_secret_of_ones_own(helm: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *WEBHOOK, "tls.secretName=corp-ca")
    assert [s for s in by_kind(docs, "Secret") if s.get("type") == "kubernetes.io/tls"] == []
    assert _secrets(docs, "rel-patchbay-controller") >= {"corp-ca"}
    (hook,) = by_kind(docs, "ValidatingWebhookConfiguration")[0]["webhooks"]
    # helm template reads no cluster: the Secret's ca.crt is looked up at install.
    assert "caBundle" not in hook["clientConfig"]


def test_the_webhook_needs_the_controller(helm: Path) -> None:
    proc = run_helm(helm, "template", "rel", str(CHART), "--set", "webhook.enabled=true")
    assert proc.returncode != 0
    assert "webhook.enabled: needs controller.enabled" in proc.stderr


def _render_against(helm: Path, kubeconfig: Path, namespace: str, *sets: str) -> dict[str, Any]:
    """The chart's TLS Secrets and caBundle as an upgrade would render them
    (``--dry-run=server``: its ``lookup`` reads the cluster)."""
    # Cluster-scoped DeviceClasses other tests applied would not be this release's to adopt.
    args = [a for s in (*sets, "deviceClasses.enabled=false") for a in ("--set", s)]
    proc = run_helm(
        helm, "template", "rel", str(CHART), "--namespace", namespace, "--dry-run=server",
        "--kubeconfig", str(kubeconfig), *args,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    out = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret") if s["type"].endswith("tls")}
    for vwc in by_kind(docs, "ValidatingWebhookConfiguration"):
        out["caBundle"] = vwc["webhooks"][0]["clientConfig"]["caBundle"]
    return out


def test_upgrades_keep_the_ca_and_reissue_for_new_names(
    helm: Path, local_cluster: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig
    first = _render_against(helm, kc, namespace, *BASE)
    owner = {"meta.helm.sh/release-name": "rel", "meta.helm.sh/release-namespace": namespace}
    for secret in first.values():  # installed, owned by the release as helm install would
        meta = secret["metadata"]
        annotations = {**(meta.get("annotations") or {}), **owner}
        core.create_namespaced_secret(namespace, {**secret, "metadata": {
            "name": meta["name"], "labels": meta["labels"], "annotations": annotations,
        }})  # fmt: skip
    again = _render_against(helm, kc, namespace, *BASE)
    assert {k: v["data"] for k, v in again.items()} == {k: v["data"] for k, v in first.items()}
    # The webhook turned on: the same CA, a certificate re-issued for both Services.
    on = _render_against(helm, kc, namespace, *WEBHOOK)
    ca, serving = on["rel-patchbay-tls-ca"], on["rel-patchbay-tls"]
    assert ca["data"] == first["rel-patchbay-tls-ca"]["data"]
    assert serving["data"]["tls.crt"] != first["rel-patchbay-tls"]["data"]["tls.crt"]
    assert on["caBundle"] == serving["data"]["ca.crt"] == ca["data"]["tls.crt"]
    _write(tmp_path, serving, "ca.crt", "tls.crt")
    assert _verifies(tmp_path, f"rel-patchbay-webhook.{namespace}.svc")
    assert _verifies(tmp_path, f"rel-patchbay-fabric.{namespace}.svc")
    # A release of a chart without the CA Secret: its pair is kept while the names stay.
    core.delete_namespaced_secret("rel-patchbay-tls-ca", namespace)
    core.patch_namespaced_secret(
        "rel-patchbay-tls",
        namespace,
        {"metadata": {"annotations": {"patchbay.dev/tls-names": None}}},
    )
    legacy = _render_against(helm, kc, namespace, *BASE)
    assert set(legacy) == {"rel-patchbay-tls"}
    assert legacy["rel-patchbay-tls"]["data"] == first["rel-patchbay-tls"]["data"]
