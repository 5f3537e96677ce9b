"""The chart's ``kubeletPlugin.hostPID`` opt-in, rendered by the pinned helm (issue 37).

Why this module exists: NVML's per-process utilization names host PIDs, and
the idle sampler maps a process to its pod (and so a share of a GPU to its
claim) only through the host's ``/proc`` (docs/leases.md, "A share's
processes"). The chart puts the plugin in the host's PID namespace only
when asked: off by default (it shows the plugin every process of the node),
on with ``kubeletPlugin.hostPID=true``; the apiserver takes the rendering
(server-side apply), and a value that is not a boolean is refused by the
chart's schema, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chart import CHART, NO_NODE, Applier, by_kind, render, run_helm
from tests.e2e.helpers import unique

pytestmark = pytest.mark.cluster


def _plugin_pod(docs: list[Any]) -> dict[str, Any]:
    (ds,) = [d for d in by_kind(docs, "DaemonSet")
             if d["metadata"]["labels"]["app.kubernetes.io/component"] == "plugin"]  # fmt: skip
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def test_host_pid_is_off_by_default(helm: Path, namespace: str) -> None:
    assert "hostPID" not in _plugin_pod(render(helm, unique("pbp"), namespace))


def test_host_pid_renders_only_when_on_and_applies(
    helm: Path, namespace: str, applier: Applier
) -> None:
    off = render(helm, unique("pbp"), namespace, None, "kubeletPlugin.hostPID=false")
    assert "hostPID" not in _plugin_pod(off)
    docs = render(helm, unique("pbp"), namespace, None, "kubeletPlugin.hostPID=true",
                  "kubeletPlugin.nodeSelector.patchbay\\.dev/helm-e2e=no-such-node")  # fmt: skip
    pod = _plugin_pod(docs)
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == NO_NODE  # nothing of it runs anywhere
    assert "hostNetwork" not in pod  # one opt-in does not bring the other
    (ds,) = [d for d in by_kind(docs, "DaemonSet") if d["spec"]["template"]["spec"] is pod]
    applier.apply(ds, namespace)


def test_a_host_pid_that_is_not_a_boolean_is_refused_naming_it(helm: Path) -> None:
    done = run_helm(helm, "template", "pbp", str(CHART), "--set", "kubeletPlugin.hostPID=yes")
    assert done.returncode != 0
    assert "hostPID" in done.stderr, done.stderr
