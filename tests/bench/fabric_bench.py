"""Composable GPU figures: allocation-to-Running latency of a fabric GPU and
the API writes one attach costs.

Setting: the local control plane, one GPU-less simulated node (node agent +
plugin), the simulated fabric with one GPU reachable through the node's
adapter, and the controller. For each fabric latency (0 s and a realistic
value) pods asking for `gpu.patchbay.dev` are created one after another; we
time claim allocated -> pod Running, and count, from the pod's creation to
Running, the writes the apiserver served (its request counter, all
clients) by resource. Figures only.
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import cluster as localk8s
import yaml
from fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from kubernetes import client, config
from simnode import SimNode, apply_rbac, build_nvml_mock

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = "--fabric-adapters=adapter0=0000:15:02.0,adapter1=0000:85:01.0"


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
RESOURCES = ("resourceclaims", "resourceslices", "nodes", "pods")


def write_counts(api: client.ApiClient) -> dict[str, float]:
    """Writes the apiserver has served, by resource[/subresource] (all clients)."""
    conf = api.configuration
    ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert)
    ctx.load_cert_chain(conf.cert_file, conf.key_file)
    with urllib.request.urlopen(conf.host + "/metrics", context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        verb, res = labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"')
        if verb in WRITE_VERBS and res in RESOURCES:
            sub = labels.get("subresource", '""').strip('"')
            key = f"{res}/{sub}" if sub else res
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def one_pod(core: Any, res: Any, name: str) -> tuple[float, dict[str, float]]:
    before = write_counts(core.api_client)
    core.create_namespaced_pod("bench", {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "m", "image": "pause",
                                  "resources": {"claims": [{"name": "c"}]}}],
                 "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "gpu"}]},
    })  # fmt: skip
    allocated = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if allocated is None:
            claims = res.list_namespaced_resource_claim("bench").items
            if any(c.status and c.status.allocation for c in claims):
                allocated = time.monotonic()
        if core.read_namespaced_pod(name, "bench").status.phase == "Running":
            break
        time.sleep(0.05)
    latency = time.monotonic() - (allocated or deadline)
    after = write_counts(core.api_client)
    writes = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    core.delete_namespaced_pod(name, "bench")
    while any(p.metadata.name == name for p in core.list_namespaced_pod("bench").items):
        time.sleep(0.1)
    return latency, writes


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="fabric_bench")
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--latencies", default="0,2")
    args = parser.parse_args(argv)
    build_nvml_mock()
    run = Path(tempfile.mkdtemp(prefix="pbf-", dir="/tmp"))
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    node = fabric = ctl = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        apply_rbac(cluster.kubeconfig, "plugin.yaml")
        apply_rbac(cluster.kubeconfig, "controller.yaml")
        for doc in yaml.safe_load_all(
            (REPO / "deviceclasses" / "gpu.patchbay.dev.yaml").read_text()
        ):
            res.create_device_class(doc)
        core.create_namespace({"metadata": {"name": "bench"}})
        while not core.list_namespaced_service_account("bench").items:
            time.sleep(0.2)  # pods need the namespace's default ServiceAccount
        plugin_kc = cluster.kubeconfig_for(
            "patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",)
        )
        node = SimNode(cluster, "fab-0", "fabric-adapters", plugin_kc, (ADAPTERS,)).start()
        fabric = FabricService(
            run / "fabric",
            {"switches": [switch("sw0", [(node.name, "adapter0", node.host.dir)], ["gpu-0"])]},
        ).start(attach_latency=0.0)
        ctl_kc = cluster.kubeconfig_for(
            "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
        )
        ctl = ControllerProcess(ctl_kc, fabric, run / "controller.log").start()
        res.create_namespaced_resource_claim_template("bench", {
            "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}}},
        })  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            slices = [s for s in res.list_resource_slice().items if s.spec.pool.name == "fabric"]
            if sum(len(s.spec.devices or []) for s in slices) == 1:
                break
            time.sleep(0.2)
        for latency in (float(x) for x in args.latencies.split(",")):
            fabric.faults(attachLatencySeconds=latency, detachLatencySeconds=0)
            times, writes = [], []
            for i in range(args.pods):
                t, w = one_pod(core, res, f"p-{int(latency * 10)}-{i}")
                times.append(t)
                writes.append(w)
            keys = sorted({k for w in writes for k in w})
            per = {k: statistics.median(w.get(k, 0.0) for w in writes) for k in keys}
            print(
                f"fabric attach latency {latency:.1f}s: allocation->Running median "
                f"{statistics.median(times):.2f}s max {max(times):.2f}s (n={len(times)}); "
                f"beyond the fabric: {statistics.median(times) - latency:.2f}s; apiserver writes "
                f"per pod (all clients, pod creation to Running): "
                + ", ".join(f"{k} {v:.0f}" for k, v in per.items())
            )
    finally:
        for proc in (ctl, fabric, node):
            if proc is not None:
                proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
