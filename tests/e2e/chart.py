"""Rendering the Helm chart and applying what it renders, for the chart tests.

Why a module: tests/e2e/test_helm_chart.py (the chart's objects) and
tests/e2e/test_monitoring_chart.py (its monitoring objects, with the
prometheus-operator CRDs) render and apply the same way; the ``helm`` and
``applier`` fixtures in tests/e2e/conftest.py are built from these. Tools
come from the make targets that cache them (``helm-bin``, ``promtool``,
``prometheus-crds``): a missing one fails under CI=true and skips otherwise.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster_fixtures import missing_prerequisite
from tests.e2e.discovery import dynamic_client

# Shared cluster: no node may run the chart's pods (other tests' node agents
# would see them), so every applied workload gets a selector nothing matches.
NO_NODE = {"patchbay.dev/helm-e2e": "no-such-node"}

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "patchbay"


def cached_tool(target: str, path_target: str) -> Path:
    """Run ``make target`` (build or reuse) and return what ``make path_target`` prints."""
    proc = subprocess.run(["make", "-s", "-C", str(REPO), target], check=False)
    if proc.returncode != 0:
        missing_prerequisite(f"`make {target}` failed")
    out = subprocess.run(
        ["make", "-s", "-C", str(REPO), path_target], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, check=False)


def render(
    helm: Path, release: str, namespace: str, values: Path | None = None, *sets: str
) -> list[Any]:
    extra = ["-f", str(values)] if values else []
    for s in sets:
        extra += ["--set", s]
    proc = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *extra)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[Any], kind: str) -> list[Any]:
    return [d for d in docs if d["kind"] == kind]


class Applier:
    """Server-side apply (PATCH application/apply-patch+yaml) of rendered objects."""

    def __init__(self, api: client.ApiClient) -> None:
        self.dyn = dynamic_client(api)
        self.applied: list[tuple[Any, str, str | None]] = []

    def apply(self, doc: dict[str, Any], namespace: str) -> Any:
        res = self.dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        # A namespaced object the chart places itself (a Role in "default") stays there.
        ns = (doc["metadata"].get("namespace") or namespace) if res.namespaced else None
        out = res.server_side_apply(
            body=doc, namespace=ns, field_manager="patchbay-helm-e2e", force_conflicts=True
        )
        # DeviceClasses stay: they are the ones every e2e test applies (same bytes).
        if doc["kind"] != "DeviceClass":
            self.applied.append((res, doc["metadata"]["name"], ns))
        return out

    def cleanup(self) -> None:
        for res, name, ns in reversed(self.applied):
            with contextlib.suppress(ApiException):
                res.delete(name=name, namespace=ns)
