"""Kueue's manager as a process against the local control plane, webhooks included.

Why this module exists: the Kueue e2e test needs the real Kueue v0.17 manager
(built from its Go module by ``make kueue-bin``, cached outside the tree) with
its CRDs and admission webhooks, not an imitation. What it takes to run it off
a cluster, found out here:

- Kueue's internal cert management issues a serving certificate for
  ``kueue-webhook-service.kueue-system.svc`` and writes its CA into the webhook
  configurations and the CRDs' conversion webhooks (it waits until every one of
  them holds it, so the five CRDs of Kueue's conversion patches must name a
  conversion webhook). The apiserver calls a ``clientConfig.service`` webhook
  with that server name; an ``ExternalName`` Service pointing at ``localhost``
  makes it dial loopback (k8s.io/apiserver ResolveCluster: host = externalName,
  port = the webhook's service port), so the certificate verifies unchanged.
- Only the webhooks of what runs here are registered: Kueue's own objects and
  batch/v1 Jobs (the only integration enabled). A webhook for a framework the
  manager does not serve (pods, deployments) would fail every such request.
- Kueue writes its certificate into a Secret and waits for the files in its
  cert directory (in its Deployment, a secret volume): the helper creates the
  empty Secret and writes the files, as the kubelet would.
- The manager runs as its own user (``USER``), bound to Kueue's own
  ClusterRole and Secrets Role from the module; without leader election,
  metrics or the visibility server.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster_fixtures import missing_prerequisite
from tests.e2e.helpers import wait_for
from tests.harness.cluster_proc import Component, free_port, stop_group

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deviceclasses" / "examples" / "kueue" / "kueue-config.yaml"
NAMESPACE = "kueue-system"
# Kueue's defaults for InternalCertManagement.WebhookServiceName and WebhookSecretName.
SERVICE, SECRET = "kueue-webhook-service", "kueue-webhook-server-cert"
USER = "kueue-manager"  # the manager's identity (a client certificate CN)
# Webhook paths of what the manager serves here (config/components/webhook/manifests.yaml).
SERVED = ("-kueue-x-k8s-io-", "-batch-v1-job")


def kueue_dir() -> Path:
    """The cached build (bin/, crd/, webhook/), made by ``make kueue-bin`` if missing."""
    if subprocess.run(["make", "-s", "-C", str(REPO), "kueue-bin"], check=False).returncode:
        missing_prerequisite("`make kueue-bin` failed (is Go >= 1.26 installed?)")
    out = subprocess.run(
        ["make", "-s", "-C", str(REPO), "kueue-dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def _service_ref(port: int, path: str) -> dict[str, Any]:
    return {"service": {"namespace": NAMESPACE, "name": SERVICE, "path": path, "port": port}}


def crds(build: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs, with the conversion webhook of Kueue's own patches where it has one."""
    converted = set()
    for patch in (build / "crd" / "patches").glob("webhook_in_*.yaml"):
        converted.add(yaml.safe_load(patch.read_text())["metadata"]["name"])
    out = []
    for path in sorted((build / "crd").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": _service_ref(port, "/convert"),
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhook_configurations(build: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, named as its cert manager expects."""
    out = []
    for doc in yaml.safe_load_all((build / "webhook" / "manifests.yaml").read_text()):
        kind = "mutating" if doc["kind"] == "MutatingWebhookConfiguration" else "validating"
        doc["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}
        hooks = [
            w
            for w in doc["webhooks"]
            if any(s in w["clientConfig"]["service"]["path"] for s in SERVED)
        ]
        for hook in hooks:
            hook["clientConfig"] = _service_ref(port, hook["clientConfig"]["service"]["path"])
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def rbac(build: Path) -> list[dict[str, Any]]:
    """Kueue's manager ClusterRole and its Secrets Role (kueue-system), bound to USER."""
    out: list[dict[str, Any]] = []
    for name, kind in (("role", "ClusterRole"), ("manager_secrets_role", "Role")):
        role = yaml.safe_load((build / "rbac" / f"{name}.yaml").read_text())
        meta = {"name": f"kueue-{role['metadata']['name']}"}
        if kind == "Role":
            meta["namespace"] = NAMESPACE
        out.append({**role, "metadata": meta})
        group = "rbac.authorization.k8s.io"
        out.append({
            "apiVersion": f"{group}/v1", "kind": f"{kind}Binding", "metadata": meta,
            "roleRef": {"apiGroup": group, "kind": kind, "name": meta["name"]},
            "subjects": [{"apiGroup": group, "kind": "User", "name": USER}],
        })  # fmt: skip
    return out


def manager_config(run_dir: Path, webhook_port: int, health_port: int) -> dict[str, Any]:
    """The shipped configuration with only process-local settings changed."""
    cfg: dict[str, Any] = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    cfg["health"] = {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    cfg["metrics"] = {"bindAddress": "0"}
    cfg["webhook"] = {"port": webhook_port, "certDir": str(run_dir / "certs")}
    cfg["leaderElection"] = {"leaderElect": False}
    cfg["featureGates"] = {**cfg["featureGates"], "VisibilityOnDemand": False}
    return cfg


def _create_or_replace(create: Any, replace: Any, read: Any, body: dict[str, Any]) -> None:
    try:
        create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        body["metadata"]["resourceVersion"] = read(
            body["metadata"]["name"]
        ).metadata.resource_version
        replace(body["metadata"]["name"], body)


def _rbac_call(
    authz: client.RbacAuthorizationV1Api, verb: str, obj: dict[str, Any], arg: Any
) -> Any:
    """``authz.<verb>_[namespaced_]<kind>(arg[, namespace])`` for an RBAC object."""
    kind = "".join(f"_{c.lower()}" if c.isupper() else c for c in obj["kind"]).lstrip("_")
    ns = obj["metadata"].get("namespace")
    if ns is None:
        return getattr(authz, f"{verb}_{kind}")(arg)
    call = getattr(authz, f"{verb}_namespaced_{kind}")
    return call(ns, arg) if verb == "create" else call(arg, ns)  # the client's argument orders


class KueueManager:
    """Install Kueue's objects, run its manager, remove its webhooks afterwards.

    ``api`` is an admin client (to install); ``kubeconfig`` the manager's, for
    ``USER``."""

    def __init__(self, api: client.ApiClient, kubeconfig: Path, run_dir: Path) -> None:
        self.api, self.kubeconfig, self.run_dir = api, kubeconfig, run_dir
        self.build = kueue_dir()
        self.webhook_port, self.health_port = free_port(), free_port()
        self.component: Component | None = None

    def install(self) -> None:
        core = client.CoreV1Api(self.api)
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        # Kueue's cert rotator fills this Secret but does not create it (its
        # kustomize manifests ship it empty).
        with contextlib.suppress(ApiException):
            core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": SECRET}})
        with contextlib.suppress(ApiException):
            core.delete_namespaced_service(SERVICE, NAMESPACE)
        core.create_namespaced_service(NAMESPACE, {
            "metadata": {"name": SERVICE},
            "spec": {"type": "ExternalName", "externalName": "localhost",
                     "ports": [{"port": self.webhook_port}]},
        })  # fmt: skip
        authz = client.RbacAuthorizationV1Api(self.api)
        for obj in rbac(self.build):
            with contextlib.suppress(ApiException):  # same rules every run: delete, create
                _rbac_call(authz, "delete", obj, obj["metadata"]["name"])
            _rbac_call(authz, "create", obj, obj)
        ext = client.ApiextensionsV1Api(self.api)
        for crd in crds(self.build, self.webhook_port):
            _create_or_replace(
                ext.create_custom_resource_definition,
                ext.replace_custom_resource_definition,
                ext.read_custom_resource_definition,
                crd,
            )
        adm = client.AdmissionregistrationV1Api(self.api)
        mutating, validating = webhook_configurations(self.build, self.webhook_port)
        _create_or_replace(
            adm.create_mutating_webhook_configuration,
            adm.replace_mutating_webhook_configuration,
            adm.read_mutating_webhook_configuration,
            mutating,
        )
        _create_or_replace(
            adm.create_validating_webhook_configuration,
            adm.replace_validating_webhook_configuration,
            adm.read_validating_webhook_configuration,
            validating,
        )

    def start(self, timeout: float = 120) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / "config.yaml"
        config.write_text(
            yaml.safe_dump(manager_config(self.run_dir, self.webhook_port, self.health_port))
        )
        argv = [
            str(self.build / "bin" / "kueue"),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
        ]
        self.component = Component("kueue", argv, self.run_dir / "kueue.log")
        self.component.start(die_with_parent=True)
        self._mount_secret()
        url = f"http://127.0.0.1:{self.health_port}/readyz"

        def ready() -> bool:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)

        self.component.wait_ready(ready, timeout)
        # Ready means certificates are injected; the apiserver's webhook client
        # may still hold the configurations without the CA for a moment.
        wait_for("Kueue webhooks answering", self._webhooks_answer, timeout=60)

    def _mount_secret(self) -> None:
        """Do what the kubelet's secret volume does in Kueue's Deployment: Kueue
        writes its certificate into the Secret and waits for the files to appear
        in its cert directory."""
        core = client.CoreV1Api(self.api)

        def filled() -> dict[str, str] | None:
            assert self.component is not None
            self.component.check_alive()
            data = core.read_namespaced_secret(SECRET, NAMESPACE).data or {}
            return data if {"tls.crt", "tls.key", "ca.crt"} <= data.keys() else None

        data = wait_for(f"Kueue's certificate in Secret {SECRET}", filled, timeout=60)
        certs = self.run_dir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        for name in ("ca.crt", "tls.key", "tls.crt"):  # tls.crt last: the one Kueue polls for
            tmp = certs / f".{name}.tmp"
            tmp.write_bytes(base64.b64decode(data[name]))
            tmp.chmod(0o600)
            tmp.replace(certs / name)

    def _webhooks_answer(self) -> bool:
        """A dry-run ResourceFlavor create passes through Kueue's webhooks."""
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "webhook-probe"}}  # fmt: skip
        try:
            client.CustomObjectsApi(self.api).create_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "resourceflavors", body, dry_run="All"
            )
        except ApiException as exc:
            if exc.status == 500 and "webhook" in str(exc.body):
                return False
            raise
        return True

    def check_alive(self) -> None:
        if self.component is not None:
            self.component.check_alive()

    def log_tail(self) -> str:
        from tests.harness.cluster_proc import tail

        return tail(self.run_dir / "kueue.log", 40)

    def stop(self) -> None:
        adm = client.AdmissionregistrationV1Api(self.api)
        with contextlib.suppress(ApiException):
            adm.delete_mutating_webhook_configuration("kueue-mutating-webhook-configuration")
        with contextlib.suppress(ApiException):
            adm.delete_validating_webhook_configuration("kueue-validating-webhook-configuration")
        if self.component is not None and self.component.pid is not None:
            stop_group(self.component.pid, "kueue")
