"""The chart's monitoring objects: promtool on the rendered rules, and the
PodMonitors, the PrometheusRule and the dashboard ConfigMap applied
server-side with the prometheus-operator CRDs installed.

Why: a rule file that is valid YAML can still be a rule file Prometheus
refuses, and a PodMonitor that renders can still be one the operator's CRD
schema rejects. promtool comes from Debian's prometheus package and the CRDs
from the operator's Go module at the version pinned in hack/monitoring.mk
(both cached by make, never in the tree). The CRDs are installed for this
module and removed after it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests import monitoring
from tests.e2e.chart import NO_NODE, Applier, by_kind, cached_tool, render
from tests.e2e.discovery import dynamic_client
from tests.e2e.helpers import unique, wait_for

pytestmark = pytest.mark.cluster

ALL_ON = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.podMonitor.interval=30s",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
)


@pytest.fixture(scope="module")
def promtool() -> Path:
    return cached_tool("promtool", "promtool-path")


@pytest.fixture(scope="module")
def operator_crds(api_client: client.ApiClient) -> Iterator[list[str]]:
    crd_dir = cached_tool("prometheus-crds", "prometheus-crds-dir")
    dyn = dynamic_client(api_client)
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    names = []
    for path in sorted(crd_dir.glob("monitoring.coreos.com_*.yaml")):
        doc = yaml.safe_load(path.read_text())
        crds.server_side_apply(body=doc, field_manager="patchbay-e2e", force_conflicts=True)
        names.append(doc["metadata"]["name"])
    assert "podmonitors.monitoring.coreos.com" in names, names

    def established() -> bool:
        for name in names:
            conds = crds.get(name=name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conds):
                return False
        return True

    wait_for("prometheus-operator CRDs established", established, timeout=60)
    yield names
    for name in names:
        try:
            crds.delete(name=name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def rendered_rules(helm: Path, *sets: str) -> dict[str, Any]:
    docs = render(helm, "pbm", "patchbay", None, "monitoring.prometheusRule.enabled=true", *sets)
    (rule,) = by_kind(docs, "PrometheusRule")
    spec: dict[str, Any] = rule["spec"]
    return spec


def promtool_check(promtool: Path, spec: dict[str, Any], tmp_path: Path) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"


def test_monitoring_is_off_by_default(helm: Path) -> None:
    kinds = {d["kind"] for d in render(helm, "pbm", "patchbay")}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    assert not by_kind(render(helm, "pbm", "patchbay"), "ConfigMap")


def test_rendered_rules_pass_promtool(helm: Path, promtool: Path, tmp_path: Path) -> None:
    spec = rendered_rules(helm)
    # The template embeds the chart's rule file as it is.
    assert spec == yaml.safe_load(monitoring.RULES.read_text())
    out = promtool_check(promtool, spec, tmp_path)
    count = len(monitoring.alert_expressions())
    assert out.startswith("rc=0") and f"SUCCESS: {count} rules found" in out, out
    # The check can fail: a broken expression does.
    spec["groups"][0]["rules"][0]["expr"] = "sum by (pod (patchbay_prepared_claims)"
    assert promtool_check(promtool, spec, tmp_path).startswith("rc=1")


def test_monitoring_objects_apply_server_side(
    helm: Path, namespace: str, applier: Applier, operator_crds: list[str], tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "kubeletPlugin": {"nodeSelector": NO_NODE},
                "controller": {"enabled": True, "nodeSelector": NO_NODE},
                "fabric": {"enabled": True, "nodeSelector": NO_NODE, "topology": {"fabrics": []}},
                "monitoring": {"dashboard": {"annotations": {"grafana_folder": "DRA"}}},
            }
        )
    )
    release = unique("pbm")
    docs = render(helm, release, namespace, values, *ALL_ON)
    monitors = {d["metadata"]["name"]: d for d in by_kind(docs, "PodMonitor")}
    assert set(monitors) == {f"{release}-patchbay-plugin", f"{release}-patchbay-controller"}
    pods = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    for component in ("plugin", "controller"):
        pm = monitors[f"{release}-patchbay-{component}"]["spec"]
        labels = pods[component]["spec"]["template"]["metadata"]["labels"]
        assert pm["selector"]["matchLabels"].items() <= labels.items(), component
        (ctr,) = pods[component]["spec"]["template"]["spec"]["containers"]
        assert [p["name"] for p in ctr["ports"]] == [pm["podMetricsEndpoints"][0]["port"]]
        assert pm["podMetricsEndpoints"][0]["relabelings"] == [
            {"targetLabel": "patchbay_component", "replacement": component}
        ]
    configmaps = by_kind(docs, "ConfigMap")
    (dashboard,) = [d for d in configmaps if d["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["patchbay.json"]) == json.loads(
        monitoring.DASHBOARD.read_text()
    )
    for doc in docs:
        if doc["kind"] in ("PodMonitor", "PrometheusRule", "ConfigMap"):
            applier.apply(doc, namespace)
    dyn = applier.dyn
    stored = dyn.resources.get(api_version="monitoring.coreos.com/v1", kind="PrometheusRule").get(
        name=f"{release}-patchbay", namespace=namespace
    )
    assert len(stored.spec.groups[0].rules) == len(monitoring.alert_expressions())
    # The CRD schemas are enforced: a PodMonitor the operator could not read is refused.
    broken = json.loads(json.dumps(monitors[f"{release}-patchbay-plugin"]))
    broken["metadata"]["name"] = unique("broken")
    broken["spec"]["podMetricsEndpoints"][0]["scheme"] = "gopher"
    with pytest.raises(ApiException) as refused:
        applier.apply(broken, namespace)
    assert refused.value.status == 422, refused.value.body
