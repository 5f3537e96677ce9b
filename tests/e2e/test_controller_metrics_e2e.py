"""The real controller's /metrics while it attaches and detaches a fabric GPU.

The fabric environment of tests/e2e/conftest.py (two simulated nodes, the
simulated fabric, the controller with ``--metrics-port``): a pod takes a
fabric GPU, so the controller attaches it; the pod goes, so it detaches it.
Each scrape is parsed with prometheus-client's text parser: the attach and
detach are counted and timed, the pool size and the fabric devices follow,
and every controller metric the chart's dashboard and alerts read is served
(the plugin's are checked against a real plugin in
tests/integration/test_plugin_metrics.py).
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import monitoring
from tests.e2e.fabric_helpers import (
    Env,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import wait_for
from tests.e2e.pods import gone, pod

pytestmark = pytest.mark.cluster


def scrape(env: Env) -> tuple[set[str], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    (arg,) = [a for a in env.ctl.extra if a.startswith("--metrics-port=")]
    url = f"http://127.0.0.1:{arg.split('=', 1)[1]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        families = list(text_string_to_metric_families(resp.read().decode()))
    names = monitoring.served_names([(f.name, f.type) for f in families])
    samples = {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}
    return names, samples


def value(env: Env, name: str, **labels: str) -> float | None:
    return scrape(env)[1].get((name, frozenset(labels.items())))


def settles(env: Env, name: str, want: float, **labels: str) -> None:
    """Wait until the sample reads ``want``: the controller counts an operation
    just after the write that lets the pod go on, so a scrape right after the
    pod runs may come first on a loaded machine."""
    wait_for(
        f"{name}{labels or ''} == {want:g} (last {value(env, name, **labels)})",
        lambda: value(env, name, **labels) == want,
        timeout=30,
    )


def test_controller_metrics_follow_an_attach_and_a_detach(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    settles(env, "patchbay_controller_leader", 1)
    settles(env, "patchbay_fabric_pool_devices", env.pool_size)
    attach_ok = {"op": "attach", "result": "ok"}
    before = value(env, "patchbay_fabric_operations_total", **attach_ok) or 0
    timed = value(env, "patchbay_fabric_operation_duration_seconds_count", **attach_ok) or 0

    tmpl = template(resource_api, ns, "gm", [gpu_request(fabric_device="gpu-0")])
    pod(core, ns, "metrics", node, tmpl)
    running(env, core, ns, "metrics")
    settles(env, "patchbay_fabric_operations_total", before + 1, **attach_ok)
    settles(env, "patchbay_fabric_operation_duration_seconds_count", timed + 1, **attach_ok)
    wait_for(
        "the attached GPU counted",
        lambda: (value(env, "patchbay_fabric_devices", type="gpu", state="attached") or 0) >= 1,
        timeout=30,
    )
    settles(env, "patchbay_fabric_operations_in_flight", 0, op="attach")
    # One attach, counted once: not again while the pod runs.
    assert value(env, "patchbay_fabric_operations_total", **attach_ok) == before + 1
    names, _ = scrape(env)
    # Every controller metric the dashboard and the alerts read is served.
    wanted = monitoring.used_metrics() - monitoring.exported("plugin")
    assert wanted and wanted <= names, sorted(wanted - names)

    detached = value(env, "patchbay_fabric_operations_total", op="detach", result="ok") or 0
    gone(core, ns, "metrics")
    wait_for(
        "the detach counted",
        lambda: (
            (value(env, "patchbay_fabric_operations_total", op="detach", result="ok") or 0)
            > detached
        ),
        timeout=60,
    )
    # One detach, counted once, and timed once.
    assert value(env, "patchbay_fabric_operations_total", op="detach", result="ok") == detached + 1
    count = value(env, "patchbay_fabric_operation_duration_seconds_count", op="detach", result="ok")
    assert count == detached + 1
