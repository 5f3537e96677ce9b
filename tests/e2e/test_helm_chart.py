"""The Helm chart against the real apiserver: lint, render, apply, and its policy.

Why: a chart that renders is not a chart that installs. Server-side apply to
the local control plane makes the apiserver validate every object (schemas,
RBAC rules, the ValidatingAdmissionPolicy's CEL); then the policy itself is
exercised by impersonating the plugin's ServiceAccount.

Node identity: a pod-bound ServiceAccount token carries the node name in the
user's extra `authentication.kubernetes.io/node-name` (k8s.io/apiserver
serviceaccount.NodeNameKey, 1.37). The local cluster issues client
certificates, not pod-bound tokens, so the admin identity impersonates the
plugin's ServiceAccount and sets that extra with the header
`Impersonate-Extra-authentication.kubernetes.io%2Fnode-name` (the key is
percent-encoded; the apiserver unescapes it), which yields the same user info
the policy sees in production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from driver.controller.process.settings import ControllerSettings
from driver.settingsflags import parse_settings
from plugin.settings import PluginSettings
from tests.e2e.admission import until_refused
from tests.e2e.chart import CHART, NO_NODE, Applier, by_kind, render, run_helm
from tests.e2e.helpers import delete_quietly, make_node, unique

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NODE_NAME_EXTRA = "Impersonate-Extra-authentication.kubernetes.io%2Fnode-name"
NON_DEFAULT = {
    "image": {"repository": "registry.example/patchbay", "tag": "1.2.3"},
    "kubeletPlugin": {
        "nodeSelector": NO_NODE,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "hostNetwork": True,
        "rollingUpdateSockets": False,
        "metricsPort": 0,
        "hotplugSource": "none",
        "migGpus": "all",
        "idleSampleInterval": 10.5,
        "idleWindow": 600,
        "vfConfigData": {"pfs": [{"pciBusID": "0000:3b:00.0", "numVfs": 4}]},
        "extraHostPathMounts": [{"name": "sim", "path": "/var/lib/patchbay-sim"}],
    },
    "controller": {"enabled": True, "replicas": 2, "nodeSelector": NO_NODE, "deviceLeases": True},
    "fabric": {
        "enabled": True,
        "nodeSelector": NO_NODE,
        "token": "s3cret",
        "topology": {"fabrics": []},
    },
    # Applied for real (the apiserver compiles its matchCondition): scoped to
    # namespaces nobody labels, so Fail never touches the other tests' claims.
    "webhook": {
        "enabled": True,
        "failurePolicy": "Fail",
        "namespaceSelector": {"matchLabels": {"patchbay.dev/helm-e2e": "no-such-namespace"}},
        "timeoutSeconds": 3,
    },
}


def test_helm_lint_passes(helm: Path, tmp_path: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(NON_DEFAULT))
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("kubeletPlugin.cdiRot=/var/run/cdi", "cdiRot"),  # misspelt key
        ("kubeletPlugin.metricsPort=http", "metricsPort"),  # wrong type
        ("kubeletPlugin.logLevel=verbose", "logLevel"),  # not an allowed value
        ("controler.enabled=true", "controler"),  # misspelt section
    ],
)
def test_schema_rejects_bad_value_naming_it(helm: Path, setting: str, named: str) -> None:
    proc = run_helm(helm, "template", "x", str(CHART), "--set", setting)
    assert proc.returncode != 0, f"--set {setting} rendered"
    assert named in proc.stderr, proc.stderr


def test_default_render_applies_server_side(
    helm: Path, namespace: str, applier: Applier, resource_api: client.ResourceV1Api
) -> None:
    docs = render(helm, unique("pbh"), namespace)
    shipped = sorted(p.name.removesuffix(".yaml") for p in (REPO / "deviceclasses").glob("*.yaml"))
    assert "mig-3g.patchbay.dev" in shipped  # the per-profile MIG classes (docs/kueue.md)
    assert sorted(d["metadata"]["name"] for d in by_kind(docs, "DeviceClass")) == shipped
    assert not by_kind(docs, "Deployment"), "controller and fabric are off by default"
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    env = {e["name"]: e for e in ctr["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["CDI_ROOT"]["value"] == "/var/run/cdi"
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert ctr["securityContext"]["privileged"] is True
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["priorityClassName"] == "system-node-critical"
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/patchbay.dev",
        "/var/run/cdi", "/sys", "/dev", "/", "/run/patchbay/mps",
    }  # fmt: skip
    assert env["MPS_ROOT"]["value"] == "/run/patchbay/mps"  # the same path inside: CDI mounts it
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert mounts["mps-root"]["mountPath"] == "/run/patchbay/mps"
    # The driver root (a host install: "/") is mounted read-only where the plugin looks.
    assert mounts["driver-root"] == {"name": "driver-root", "mountPath": "/driver-root",
                                     "readOnly": True}  # fmt: skip
    assert env["DRIVER_ROOT"]["value"] == "/driver-root"
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/healthz"
    pod["nodeSelector"] = NO_NODE  # see NO_NODE: the only change to the default render
    for doc in docs:
        applier.apply(doc, namespace)
    stored = resource_api.read_device_class("gpu.patchbay.dev")
    assert 'device.attributes["patchbay.dev"].type == "gpu"' in (
        stored.spec.selectors[0].cel.expression
    )


def test_non_default_render_applies_server_side(
    helm: Path, namespace: str, applier: Applier, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(NON_DEFAULT))
    docs = render(helm, unique("pbh"), namespace, values)
    (ds,) = by_kind(docs, "DaemonSet")
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert ctr["image"] == "registry.example/patchbay:1.2.3"
    assert "POD_UID" not in env
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "livenessProbe" not in ctr, "metricsPort 0: nothing to probe"
    assert env["VF_CONFIG"] == "/etc/patchbay/vf-config.yaml"
    assert env["MIG_GPUS"] == "all"
    deployments = {d["spec"]["template"]["spec"]["containers"][0]["command"][0]: d
                   for d in by_kind(docs, "Deployment")}  # fmt: skip
    assert set(deployments) == {"patchbay-controller", "patchbay-fabric"}
    assert deployments["patchbay-controller"]["spec"]["replicas"] == 2
    (vwc,) = by_kind(docs, "ValidatingWebhookConfiguration")
    assert vwc["webhooks"][0]["failurePolicy"] == "Fail"
    for doc in docs:
        applier.apply(doc, namespace)


def _slice(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "patchbay.dev",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def _as_plugin(local_cluster: Any, user: str, node: str | None) -> client.ApiClient:
    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    api.default_headers["Impersonate-User"] = user
    if node is not None:
        api.default_headers[NODE_NAME_EXTRA] = node
    return api


def test_plugin_may_write_only_its_own_nodes_slices(
    helm: Path,
    namespace: str,
    applier: Applier,
    local_cluster: Any,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
) -> None:
    release = unique("pbh")
    docs = render(helm, release, namespace)
    for doc in docs:
        if doc["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} or (
            doc["kind"].startswith("ValidatingAdmissionPolicy")
        ):
            applier.apply(doc, namespace)
    (sa,) = by_kind(docs, "ServiceAccount")
    user = f"system:serviceaccount:{namespace}:{sa['metadata']['name']}"
    own, other = unique("own"), unique("other")
    for node in (own, other):
        make_node(core, node)
    admin_slice = unique("slice")
    resource_api.create_resource_slice(_slice(admin_slice, other))
    plugin_api = _as_plugin(local_cluster, user, own)
    slices = client.ResourceV1Api(plugin_api)
    try:
        until_refused(
            "the admission policy on another node's slice",
            "may only write its own Node and ResourceSlices", slices.create_resource_slice,
            _slice(unique("x"), other), statuses=(403,), timeout=30,
        )  # fmt: skip
        mine = unique("slice")
        slices.create_resource_slice(_slice(mine, own))
        # spec.nodeName is immutable, so "another node's slice" is one that exists there.
        theirs = resource_api.read_resource_slice(admin_slice)  # the plugin has no get
        theirs.metadata.labels = {"touched-by": "plugin"}
        with pytest.raises(ApiException) as updated:
            slices.replace_resource_slice(admin_slice, theirs)
        assert updated.value.status == 403
        with pytest.raises(ApiException) as deleted:
            slices.delete_resource_slice(admin_slice)
        assert deleted.value.status == 403
        slices.delete_resource_slice(mine)
        annotate = {"metadata": {"annotations": {"patchbay.dev/fabric": "{}"}}}
        client.CoreV1Api(plugin_api).patch_node(own, annotate)
        with pytest.raises(ApiException) as node_denied:
            client.CoreV1Api(plugin_api).patch_node(other, annotate)
        assert node_denied.value.status == 403
        no_node = client.ResourceV1Api(_as_plugin(local_cluster, user, None))
        with pytest.raises(ApiException) as anonymous_node:
            no_node.create_resource_slice(_slice(unique("x"), own))
        assert anonymous_node.value.status == 403, anonymous_node.value.body
        assert "credentials name no node" in anonymous_node.value.body
    finally:
        plugin_api.close()
        for item in resource_api.list_resource_slice().items:
            if item.spec.node_name in (own, other):
                delete_quietly(resource_api.delete_resource_slice, item.metadata.name)
        for node in (own, other):
            delete_quietly(core.delete_node, node)


def _rules(docs: list[Any], kinds: tuple[str, ...]) -> set[tuple[str, str, str, str]]:
    """Every (apiGroup, resource, resourceName, verb) the roles of ``kinds`` grant."""
    out: set[tuple[str, str, str, str]] = set()
    for doc in docs:
        if doc["kind"] not in kinds:
            continue
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups", [""]):
                for res in rule["resources"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        out.update((group, res, name, verb) for verb in rule["verbs"])
    return out


@pytest.mark.parametrize("component", ["plugin", "controller"])
def test_chart_roles_equal_the_roles_the_e2e_tests_run_under(
    helm: Path, tmp_path: Path, component: str
) -> None:
    """The e2e tests run the plugin and the controller under hack/rbac/*.yaml;
    the chart's roles must grant exactly the same, so those tests prove the
    chart's least-privilege roles suffice (and grant nothing more)."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(NON_DEFAULT))
    docs = [
        d for d in render(helm, "pbr", "patchbay", values)
        if d["kind"] in ("ClusterRole", "Role") and component in d["metadata"]["name"]
    ]  # fmt: skip
    assert docs, f"no roles rendered for {component}"
    local = list(yaml.safe_load_all((REPO / "hack" / "rbac" / f"{component}.yaml").read_text()))
    assert _rules(docs, ("ClusterRole", "Role")) == _rules(local, ("ClusterRole", "Role"))


@pytest.mark.parametrize(("kind", "command"), [
    ("Deployment", "patchbay-controller"),
    ("DaemonSet", "patchbay-plugin"),
])  # fmt: skip
def test_each_rendered_setting_parses_as_its_process_reads_it(
    helm: Path, tmp_path: Path, kind: str, command: str
) -> None:
    """The env the chart writes is read by the process's own settings parser:
    a value the template formats wrongly (a large integer written as
    8.388608e+06, which the controller refused at start on the real nodes)
    fails here, with every default and the non-default values."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(NON_DEFAULT))
    defaults = ("controller.enabled=true", "controller.token=t",
                "controller.fabricUrl=https://fabric.example")  # fmt: skip
    for docs in (
        render(helm, unique("pbh"), "patchbay", None, *defaults),
        render(helm, unique("pbh"), "patchbay", values),
    ):
        containers = [d["spec"]["template"]["spec"]["containers"][0] for d in by_kind(docs, kind)]
        (container,) = [c for c in containers if c.get("command", [command])[0] == command]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        model = ControllerSettings if command == "patchbay-controller" else PluginSettings
        env |= {"NODE_NAME": "node-a", "FABRIC_TOKEN": "t"}  # what valueFrom and files give
        parse_settings(model, [], env)  # raises, naming the setting, on a value it refuses
