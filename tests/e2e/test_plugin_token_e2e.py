"""A stolen plugin token cannot re-shape its Node (issue 23, item 2).

Why: the kubelet mounts a ServiceAccount token bound to the plugin pod into
it. RBAC lets that token patch Nodes and write Events; what keeps it to the
plugin's own needs is the chart: the ValidatingAdmissionPolicy
``<release>-plugin-node-fields`` (only the plugin's own annotations,
``patchbay.dev/fabric`` and ``patchbay.dev/health``, may change on the Node)
beside ``<release>-plugin-own-node-slices`` (only its own Node), and a Role
for Events in "default" only, where the apiserver keeps the Events about a
Node.

How: the chart is rendered with the pinned helm and its plugin RBAC and
policies applied to the real apiserver. A Pod of the plugin's ServiceAccount
is bound to a Node (spec.nodeName; nothing runs it), and a TokenRequest with
``boundObjectRef`` to that Pod yields the same token the kubelet would mount,
carrying the user extra ``authentication.kubernetes.io/node-name``. Every write
below is made with that token. Each refused change must be answered 403 with
a message naming the node and the field, and leave the Node as it was; the
plugin's two annotations are written (the health one with what the plugin
writes: a GPU's recovery from its health records) and removed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from driver.fabric_devices.naming import NODE_ANNOTATION
from driver.health.history import HEALTH_ANNOTATION, node_health
from driver.health.monitor import HealthMonitor
from driver.health.records import HealthRecords, Phase
from driver.kube.api import KubeApi
from driver.kube.events import WARNING, EventRecorder, ObjectRef
from tests.e2e.admission import until_refused
from tests.e2e.chart import Applier
from tests.e2e.helpers import delete_quietly, make_node, unique, wait_for
from tests.e2e.plugin_token import (
    install_plugin_rbac,
    pod_bound_token,
    token_client,
    token_kubeconfig,
)

pytestmark = pytest.mark.cluster

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
TAINT = {"key": "patchbay.dev/e2e-reserved", "effect": "NoSchedule"}
KEPT_LABEL = "patchbay.dev/e2e-pool"
OURS = (NODE_ANNOTATION, HEALTH_ANNOTATION)  # the plugin's annotations, as the policy names them
POLICY_SAYS = f"may change only the annotations {', '.join(OURS)} of Node"


@dataclass(frozen=True)
class Plugin:
    """The plugin's credentials on its node, and the admin view of that node."""

    node: str
    other: str
    namespace: str
    pod: str
    core: client.CoreV1Api  # with the pod-bound token
    kubeconfig: Path  # the same token, for driver.kube.api
    admin: client.CoreV1Api
    policies: tuple[str, ...]  # the chart's ValidatingAdmissionPolicies


@pytest.fixture(scope="module")
def plugin(
    helm: Path,
    local_cluster: Any,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Plugin]:
    namespace = unique("pbtok")
    core.create_namespace({"metadata": {"name": namespace}})
    applier = Applier(api_client)
    node, other = unique("tok-own"), unique("tok-other")
    token_api: client.ApiClient | None = None
    try:
        sa, policies = install_plugin_rbac(helm, applier, unique("pbt"), namespace)
        for name in (node, other):
            make_node(core, name, {KEPT_LABEL: "a"})
        core.patch_node(node, {"spec": {"taints": [TAINT]}})
        pod, token = pod_bound_token(core, namespace, sa, node)
        token_api = token_client(local_cluster, token)
        kubeconfig = token_kubeconfig(
            tmp_path_factory.mktemp("token") / "plugin.kubeconfig", local_cluster, token
        )
        plugin_core = client.CoreV1Api(token_api)
        yield Plugin(node, other, namespace, pod, plugin_core, kubeconfig, core, policies)
    finally:
        if token_api is not None:
            token_api.close()
        applier.cleanup()
        for name in (node, other):
            delete_quietly(core.delete_node, name)
        delete_quietly(core.delete_namespace, namespace)


@pytest.fixture(scope="module")
def policy_active(plugin: Plugin) -> Plugin:
    """The policy is in force once it refuses the plugin a label (a dry run)."""
    until_refused(
        "the plugin node-fields policy", POLICY_SAYS, plugin.core.patch_node, plugin.node,
        {"metadata": {"labels": {unique("probe"): "x"}}}, statuses=(403,), timeout=30,
    )  # fmt: skip
    return plugin


def test_the_token_is_bound_to_the_plugin_pod_on_its_node(plugin: Plugin) -> None:
    review = client.AuthenticationV1Api(plugin.core.api_client).create_self_subject_review({})
    extra = review.status.user_info.extra or {}
    assert extra.get(NODE_NAME_EXTRA) == [plugin.node], extra
    assert extra.get("authentication.kubernetes.io/pod-name") == [plugin.pod], extra


def test_the_charts_node_policies_type_check_cleanly(
    plugin: Plugin, api_client: client.ApiClient
) -> None:
    """The apiserver type-checks each policy's CEL against the Node schema and
    reports what it could not check; a misspelt field would only show there."""
    admission = client.AdmissionregistrationV1Api(api_client)

    def checked(name: str) -> Any:
        status = admission.read_validating_admission_policy(name).status
        return status.type_checking if status is not None else None

    assert len(plugin.policies) == 2, plugin.policies
    for name in plugin.policies:
        result = wait_for(f"the type check of {name}", functools.partial(checked, name), 30)
        assert not result.expression_warnings, result.expression_warnings


def _taints_without_ours(p: Plugin) -> dict[str, Any]:
    taints = p.admin.read_node(p.node).spec.taints or []
    kept = [{"key": t.key, "effect": t.effect} for t in taints if t.key != TAINT["key"]]
    return {"spec": {"taints": kept}}


CHANGES: dict[str, tuple[Callable[[Plugin], dict[str, Any]], tuple[str, ...]]] = {
    "tenant label": (
        lambda p: {"metadata": {"labels": {"node-restriction.kubernetes.io/tenant": "x"}}},
        ("label node-restriction.kubernetes.io/tenant",),
    ),
    "control-plane role": (
        lambda p: {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
        ("label node-role.kubernetes.io/control-plane",),
    ),
    "label removed": (
        lambda p: {"metadata": {"labels": {KEPT_LABEL: None}}},
        (f"label {KEPT_LABEL}",),
    ),
    "NoSchedule taint removed": (
        _taints_without_ours,
        ("spec.taints (", f"-{TAINT['key']}:{TAINT['effect']}"),
    ),
    "cordon": (lambda p: {"spec": {"unschedulable": True}}, ("spec.unschedulable",)),
    "other annotation": (
        lambda p: {"metadata": {"annotations": {"example.com/owner": "me"}}},
        ("annotation example.com/owner",),
    ),
    "fabric annotation with a label": (
        lambda p: {"metadata": {
            "annotations": {NODE_ANNOTATION: "{}"},
            "labels": {"node-role.kubernetes.io/worker": ""},
        }},
        ("not its label node-role.kubernetes.io/worker",),
    ),
    "health annotation with another annotation": (
        lambda p: {"metadata": {"annotations": {HEALTH_ANNOTATION: "{}", "example.com/x": "y"}}},
        ("not its annotation example.com/x",),
    ),
    "health annotation with a cordon": (
        lambda p: {"metadata": {"annotations": {HEALTH_ANNOTATION: "{}"}},
                   "spec": {"unschedulable": True}},
        ("not its spec.unschedulable",),
    ),
}  # fmt: skip


def _shape(p: Plugin) -> Any:
    """What the policy guards on the Node (status moves on without us)."""
    node = p.admin.read_node(p.node)
    meta = node.metadata
    return (meta.labels, meta.annotations, node.spec.to_dict())


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_beyond_the_fabric_annotation_is_refused(
    policy_active: Plugin, change: str
) -> None:
    p = policy_active
    patch, fragments = CHANGES[change]
    before = _shape(p)
    with pytest.raises(ApiException) as refused:
        p.core.patch_node(p.node, patch(p))
    body = str(refused.value.body)
    assert refused.value.status == 403, body
    message = json.loads(body)["message"]
    assert f"{POLICY_SAYS} '{p.node}'" in message, message
    assert all(f in message for f in fragments), message
    assert all(key not in message.split(", not its ")[1] for key in OURS), message
    assert _shape(p) == before


def _health_report(directory: Path) -> str:
    """What the plugin writes after a GPU's recovery (its health records)."""
    monitor = HealthMonitor(records=HealthRecords.in_dir(directory))
    monitor.report_xid("GPU-aaaa", 48)
    record = monitor.record("GPU-aaaa")
    assert record is not None
    for phase, step in ((Phase.RESETTING, "resetting"), (Phase.CHECKING, "reset")):
        record.phase = phase
        record.add(step, "a step")
        monitor.update("GPU-aaaa", record)
    monitor.mark_healthy("GPU-aaaa", "check passed")
    text = node_health(monitor.records, 3, 86400).to_annotation()
    assert text is not None
    return text


@pytest.mark.parametrize("key", OURS)
def test_its_annotations_are_written_and_removed_on_its_own_node_only(
    policy_active: Plugin, key: str, tmp_path: Path
) -> None:
    p = policy_active
    report = json.dumps({"adapters": {}}) if key == NODE_ANNOTATION else _health_report(tmp_path)
    p.core.patch_node(p.node, {"metadata": {"annotations": {key: report}}})
    assert p.admin.read_node(p.node).metadata.annotations[key] == report
    p.core.patch_node(p.node, {"metadata": {"annotations": {key: None}}})
    assert key not in (p.admin.read_node(p.node).metadata.annotations or {})
    with pytest.raises(ApiException) as elsewhere:
        p.core.patch_node(p.other, {"metadata": {"annotations": {key: report}}})
    assert elsewhere.value.status == 403
    assert "may only write its own Node" in str(elsewhere.value.body)


def test_the_policy_names_exactly_the_plugins_annotations(
    plugin: Plugin, api_client: client.ApiClient
) -> None:
    """The chart names the plugin's annotation keys once (the policy variable
    ``pluginAnnotations``); they are the keys the plugin's code writes."""
    admission = client.AdmissionregistrationV1Api(api_client)
    (fields,) = [n for n in plugin.policies if n.endswith("-plugin-node-fields")]
    variables = admission.read_validating_admission_policy(fields).spec.variables
    (named,) = [v.expression for v in variables if v.name == "pluginAnnotations"]
    assert json.loads(named) == list(OURS)


async def _record(p: Plugin, regarding: ObjectRef) -> tuple[int, int]:
    """One Event through the plugin's own recorder: (written, failed)."""
    api = await KubeApi.connect(str(p.kubeconfig))
    recorder = EventRecorder(api, "patchbay.dev/plugin", f"patchbay-plugin-{p.node}")
    task = asyncio.create_task(recorder.run())
    try:
        recorder.event(regarding, WARNING, "TokenE2E", "Checking", "written with the pod token")
        await recorder.drain()
        return recorder.stats.written, recorder.stats.failed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


def test_events_only_about_its_node_in_their_namespace(plugin: Plugin) -> None:
    p = plugin
    node = p.admin.read_node(p.node)
    node_ref = ObjectRef("Node", p.node, uid=node.metadata.uid)

    def node_event_written() -> bool:  # RBAC follows the RoleBinding through an informer
        return asyncio.run(_record(p, node_ref)) == (1, 0)

    wait_for("the plugin to write an Event about its Node", node_event_written, 30)
    events = p.admin.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={p.node}"
    )
    assert [e.reason for e in events.items if e.reason == "TokenE2E"], events.items
    pod = p.admin.read_namespaced_pod(p.pod, p.namespace)
    pod_ref = ObjectRef("Pod", p.pod, p.namespace, pod.metadata.uid)
    assert asyncio.run(_record(p, pod_ref)) == (0, 1)
    mine = p.admin.list_namespaced_event(p.namespace, field_selector=f"involvedObject.name={p.pod}")
    assert [e for e in mine.items if e.reason == "TokenE2E"] == []
