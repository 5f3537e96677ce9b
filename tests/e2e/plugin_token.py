"""The node plugin's own identity on the real apiserver: the chart's RBAC and
a pod-bound ServiceAccount token, as the kubelet mounts it.

Why a module: the token tests (``test_plugin_token_e2e``), the idle
devices tests (``test_idle_devices_e2e``) and the idle reclaim tests
(``test_idle_reclaim_e2e``, marking a claim idle as the plugin does) need
the plugin to act as
the chart makes it: its ServiceAccount, roles and admission policies
rendered with the pinned helm, and a token bound to a Pod on its node
(a TokenRequest with ``boundObjectRef``), which carries the user extra
``authentication.kubernetes.io/node-name`` the apiserver's node-scoped
checks read (``associated-node`` verbs, the chart's policies).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.chart import Applier, by_kind, render
from tests.e2e.helpers import unique

# What is installed from the rendered chart: the plugin's identity, its
# roles and bindings, and the admission policies that narrow them.
PLUGIN_KINDS = {
    "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}  # fmt: skip


def token_client(local_cluster: Any, token: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = local_cluster.server
    conf.ssl_ca_cert = str(local_cluster.pki.ca.cert)
    conf.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(conf)


def token_kubeconfig(path: Path, local_cluster: Any, token: str) -> Path:
    cluster = {
        "server": local_cluster.server,
        "certificate-authority": str(local_cluster.pki.ca.cert),
    }
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "plugin",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "plugin", "user": {"token": token}}],
        "contexts": [{"name": "plugin", "context": {"cluster": "local", "user": "plugin"}}],
    }))  # fmt: skip
    return path


def install_plugin_rbac(
    helm: Path, applier: Applier, release: str, namespace: str
) -> tuple[str, tuple[str, ...]]:
    """Apply the chart's plugin objects; the plugin ServiceAccount's name and
    the policies' names."""
    docs = [d for d in render(helm, release, namespace) if d["kind"] in PLUGIN_KINDS]
    docs = [d for d in docs if "-plugin" in d["metadata"]["name"]]
    for doc in docs:
        applier.apply(doc, namespace)
    (sa,) = by_kind(docs, "ServiceAccount")
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    return str(sa["metadata"]["name"]), tuple(d["metadata"]["name"] for d in policies)


def pod_bound_token(core: client.CoreV1Api, namespace: str, sa: str, node: str) -> tuple[str, str]:
    """A Pod of ``sa`` on ``node`` and a token bound to it, as the kubelet mounts."""
    name = unique("plugin")
    pod = core.create_namespaced_pod(namespace, {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node, "serviceAccountName": sa,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "plugin", "image": "registry.example/patchbay:none"}],
        },
    })  # fmt: skip
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                               "uid": pod.metadata.uid},
            "expirationSeconds": 3600,
        },
    }  # fmt: skip
    answer = core.create_namespaced_service_account_token(sa, namespace, request)
    return name, str(answer.status.token)
