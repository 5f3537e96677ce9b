"""The chart's MPS supervisor (kubeletPlugin.mpsSupervisor), rendered by the
pinned helm and applied server side to the real apiserver.

Why this module exists: the supervisor must outlive plugin upgrades
(``updateStrategy: OnDelete``) and see the same MPS settings and host paths
as the plugin, or the two would never meet in ``--mps-root``; these are
render-time facts the real-node tier only shows on one configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chart import Applier, by_kind, render
from tests.e2e.helpers import unique

pytestmark = pytest.mark.cluster


def _daemonsets(docs: list[Any]) -> dict[str, Any]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in by_kind(docs, "DaemonSet")}  # fmt: skip


def _container(ds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pod's only container, its env by name)."""
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    return ctr, {e["name"]: e.get("value") for e in ctr["env"]}


def test_off_by_default(helm: Path, namespace: str) -> None:
    sets = _daemonsets(render(helm, unique("pbm"), namespace))
    assert set(sets) == {"plugin"}
    _, env = _container(sets["plugin"])
    assert env["MPS_SUPERVISOR"] == "false"


def test_the_supervisor_meets_the_plugin_in_the_mps_root_and_is_never_rolled(
    helm: Path, namespace: str, applier: Applier
) -> None:
    docs = render(
        helm, unique("pbm"), namespace, None,
        "kubeletPlugin.mpsSupervisor=true", "kubeletPlugin.mpsRoot=/run/x/mps",
        "kubeletPlugin.mpsControl=/opt/mps/nvidia-cuda-mps-control",
        "kubeletPlugin.driverRoot=/run/nvidia/driver",
        "kubeletPlugin.nodeSelector.gpu=yes",
    )  # fmt: skip
    sets = _daemonsets(docs)
    assert set(sets) == {"plugin", "mps-supervisor"}
    sup, plugin = sets["mps-supervisor"], sets["plugin"]
    assert sup["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert plugin["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    ctr, env = _container(sup)
    _, plugin_env = _container(plugin)
    assert ctr["command"] == ["patchbay-mps-supervisor"]
    assert ctr["securityContext"]["privileged"] is True
    assert plugin_env["MPS_SUPERVISOR"] == "true"
    for name in ("MPS_ROOT", "MPS_CONTROL", "DRIVER_ROOT", "LOG_LEVEL"):
        assert env[name] == plugin_env[name], name
    assert env["MPS_ROOT"] == "/run/x/mps"
    spec = sup["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "yes"}  # the plugin's nodes
    assert spec["automountServiceAccountToken"] is False
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    assert host["mps-root"] == mounts["mps-root"] == "/run/x/mps"  # CDI mounts host paths
    assert (host["driver-root"], mounts["driver-root"]) == ("/run/nvidia/driver", "/driver-root")
    for doc in docs:
        applier.apply(doc, namespace)
