"""The real plugin process's /metrics, read as Prometheus reads it.

A plugin on a GPU-less simulated host with fabric adapter slots (none
configured as fabric adapters, so a GPU plugged there is a local one) and
``--metrics-port``; this test plays the kubelet (registration, prepare,
unprepare) and the hardware (a hot-plugged GPU, a critical XID). Each scrape
is parsed with prometheus-client's text parser; the histograms must have
observations after a prepare, the gauges must follow the devices, and every
plugin metric the chart's dashboard and alerts read must be served.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu
from tests import monitoring
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.cluster_proc import free_port
from tests.harness.simnode import PluginProcess
from tests.integration.kubelet import our_slices, wait_registered
from tests.integration.own_node import own_node
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Scrape:
    """One GET /metrics, parsed."""

    def __init__(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        families = list(text_string_to_metric_families(text))
        self.names = monitoring.served_names([(f.name, f.type) for f in families])
        self.samples: Samples = {
            (s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))


@pytest.fixture
def plugin(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[PluginProcess]:
    with own_node(local_cluster, core, "met-node", TOPOLOGIES["fabric-adapters"]()) as node:
        yield node.plugin(f"--metrics-port={free_port()}").start()


def metrics_port(proc: PluginProcess) -> int:
    (arg,) = [a for a in proc.extra_args if a.startswith("--metrics-port=")]
    return int(arg.split("=", 1)[1])


def test_metrics_follow_hotplug_prepare_and_health(
    plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    port, node, host = metrics_port(plugin), plugin.node_name, plugin.host
    kubelet = wait_registered(plugin)  # GetInfo, then NotifyRegistrationStatus(registered)
    endpoint = kubelet.get_info().endpoint
    published = wait_for("pool published", lambda: our_slices(resource_api, node), timeout=30)
    first = Scrape(port)
    assert first.value("patchbay_plugin_registered") == 1
    # Each slice of the pool created once, nothing else written yet.
    assert first.value("patchbay_resourceslice_writes_total", op="create") == len(published)
    assert first.value("patchbay_resourceslice_writes_total", op="update") is None
    assert first.value("patchbay_devices", attachment="local", type="gpu", health="healthy") is None

    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", Gpu(bdf=bdf))
    gpu = ("patchbay_devices", {"attachment": "local", "type": "gpu", "health": "healthy"})
    wait_for("hot-added GPU counted", lambda: Scrape(port).value(gpu[0], **gpu[1]) == 1, 30)
    assert (Scrape(port).value("patchbay_hotplug_events_total", action="add") or 0) >= 1
    wait_for("GPU published", lambda: any(
        d.name == "gpu-0" for s in our_slices(resource_api, node) for d in s.spec.devices or []
    ), timeout=30)  # fmt: skip

    uid = allocated_claim(resource_api, namespace, "m", node, ["gpu-0"])
    assert kubelet.prepare(endpoint, [(namespace, "m", uid)])[uid].error == ""
    prepared = Scrape(port)
    assert prepared.value("patchbay_prepare_duration_seconds_count") == 1
    assert (prepared.value("patchbay_prepare_duration_seconds_sum") or 0) > 0
    assert prepared.value("patchbay_prepare_duration_seconds_bucket", le="+Inf") == 1
    assert prepared.value("patchbay_prepare_claims_total", result="ok") == 1
    assert prepared.value("patchbay_prepared_claims") == 1
    assert prepared.value("patchbay_devices_prepared", attachment="local", type="gpu") == 1
    # Every plugin metric the dashboard and the alerts read is served.
    wanted = monitoring.used_metrics() & monitoring.exported("plugin")
    assert wanted and wanted <= prepared.names, sorted(wanted - prepared.names)

    host.nvml.queue_xid(host.gpu_uuids()[bdf], 48)  # double-bit ECC: critical
    bad = {"attachment": "local", "type": "gpu", "health": "unhealthy"}
    wait_for("unhealthy GPU counted", lambda: Scrape(port).value("patchbay_devices", **bad), 30)
    wait_for(
        "tainted GPU counted",
        lambda: Scrape(port).value("patchbay_devices_tainted", attachment="local", type="gpu") == 1,
        30,
    )
    assert kubelet.unprepare(endpoint, [(namespace, "m", uid)])[uid].error == ""
    after = Scrape(port)
    assert after.value("patchbay_unprepare_duration_seconds_count") == 1
    assert after.value("patchbay_prepared_claims") == 0
    assert after.value("patchbay_devices_prepared", attachment="local", type="gpu") == 0
