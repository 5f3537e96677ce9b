"""Composable device figures: allocation-to-Running latency of a fabric GPU,
NVMe drive and CXL memory expander, and the API writes one attach costs.

Setting: the local control plane, one GPU-less simulated node (node agent +
plugin), the simulated CXL fabric with one GPU and one NVMe drive behind the
node's adapter0 and one CXL Type 3 memory expander behind adapter1, and the
controller (``--dialect``: how it attaches). For each fabric latency (0 s and
a realistic value) and each kind, pods asking for its DeviceClass
(`gpu.patchbay.dev`, `nvme.patchbay.dev`, `cxl-memory.patchbay.dev`) are
created one after another; we time the pod's claim allocated -> pod Running
(median and p99), and count, from the pod's creation to Running, the writes
the apiserver served (its request counter, all clients) by resource.
Figures only.
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import time
import urllib.request
from typing import Any

from kubernetes import client, config

from tests.bench.rundir import bench_dir
from tests.harness import cluster as localk8s
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_rbac,
    build_nvml_mock,
)

ADAPTERS = "--fabric-adapters=adapter0=0000:15:02.0,adapter1=0000:85:01.0"


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
RESOURCES = ("resourceclaims", "resourceslices", "nodes", "pods")
# Kind -> the DeviceClass its pods ask for (the claim template of that name).
CLASSES = {"gpu": "gpu.patchbay.dev", "nvme": "nvme.patchbay.dev", "cxl": "cxl-memory.patchbay.dev"}


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


def allocated(core: Any, res: Any, name: str) -> bool:
    """Whether the pod's own claim is allocated."""
    statuses = core.read_namespaced_pod(name, "bench").status.resource_claim_statuses
    if not statuses or not statuses[0].resource_claim_name:
        return False
    claim = res.read_namespaced_resource_claim(statuses[0].resource_claim_name, "bench")
    return bool(claim.status and claim.status.allocation)


def one_pod(core: Any, res: Any, name: str, kind: str) -> tuple[float, dict[str, float]]:
    before = write_counts(core.api_client)
    core.create_namespaced_pod("bench", {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "m", "image": "pause",
                                  "resources": {"claims": [{"name": "c"}]}}],
                 "resourceClaims": [{"name": "c", "resourceClaimTemplateName": kind}]},
    })  # fmt: skip
    allocated_at = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if allocated_at is None and allocated(core, res, name):
            allocated_at = time.monotonic()
        if core.read_namespaced_pod(name, "bench").status.phase == "Running":
            break
        time.sleep(0.05)
    latency = time.monotonic() - (allocated_at or deadline)
    after = write_counts(core.api_client)
    writes = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    core.delete_namespaced_pod(name, "bench")
    while any(p.metadata.name == name for p in core.list_namespaced_pod("bench").items):
        time.sleep(0.1)
    return latency, writes


def p99(times: list[float]) -> float:
    """The 99th percentile (the maximum for fewer than 100 samples, interpolated)."""
    if len(times) < 2:
        return times[0]
    return statistics.quantiles(times, n=100, method="inclusive")[98]


def measure(core: Any, res: Any, kind: str, latency: float, pods: int) -> None:
    """Pods of ``kind`` one after another; print their figures."""
    times, writes = [], []
    for i in range(pods):
        t, w = one_pod(core, res, f"{kind}-{int(latency * 10)}-{i}", kind)
        times.append(t)
        writes.append(w)
    keys = sorted({k for w in writes for k in w})
    per = {k: statistics.median(w.get(k, 0.0) for w in writes) for k in keys}
    median = statistics.median(times)
    print(
        f"fabric {kind:4} attach latency {latency:.1f}s: allocation->Running median "
        f"{median:.2f}s p99 {p99(times):.2f}s (n={len(times)}); beyond the fabric: "
        f"{median - latency:.2f}s; apiserver writes per pod (all clients, pod creation to "
        "Running): " + ", ".join(f"{k} {v:.0f}" for k, v in per.items()),
        flush=True,
    )


def bench_clients(
    cluster: localk8s.LocalCluster, ns: str
) -> tuple[client.CoreV1Api, client.ResourceV1Api]:
    """API clients on `cluster` readied as the fabric benches need it: our
    plugin's and controller's RBAC, our DeviceClasses, and namespace `ns` with
    its default ServiceAccount (pods need it)."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    apply_rbac(cluster.kubeconfig, "plugin.yaml")
    apply_rbac(cluster.kubeconfig, "controller.yaml")
    apply_deviceclasses(res)
    core.create_namespace({"metadata": {"name": ns}})
    deadline = time.monotonic() + 120
    while not core.list_namespaced_service_account(ns).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {ns}'s default ServiceAccount")
        time.sleep(0.2)
    return core, res


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="fabric_bench")
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--latencies", default="0,2")
    parser.add_argument("--kinds", default=",".join(CLASSES), help="of " + ",".join(CLASSES))
    parser.add_argument("--dialect", default="connections", choices=("connections", "zones"))
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if unknown := sorted(set(kinds) - set(CLASSES)):
        parser.error(f"--kinds: unknown {unknown}; known: {sorted(CLASSES)}")
    build_nvml_mock()
    run = bench_dir("pbf-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    node = fabric = ctl = None
    try:
        core, res = bench_clients(cluster, "bench")
        plugin_kc = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
        node = SimNode(cluster, "fab-0", "fabric-adapters", plugin_kc, (ADAPTERS,)).start()
        up = [(node.name, "adapter0", node.host.dir)]
        switches = [
            switch("sw0", up, ["gpu-0"], nvmes=["nvme-0"]),
            switch("sw1", [(node.name, "adapter1", node.host.dir)], [], cxlmems=["cxl-0"]),
        ]
        fabric = FabricService(
            run / "fabric", {"id": "cxl0", "type": "CXL", "switches": switches}
        ).start(attach_latency=0.0)
        ctl_kc = cluster.kubeconfig_for(
            "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
        )
        dialect = f"--fabric-dialect={args.dialect}"
        ctl = ControllerProcess(ctl_kc, fabric, run / "controller.log", dialect).start()
        for kind, cls in CLASSES.items():
            res.create_namespaced_resource_claim_template("bench", {
                "metadata": {"name": kind},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "dev", "exactly": {"deviceClassName": cls}}]}}},
            })  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            slices = [s for s in res.list_resource_slice().items if s.spec.pool.name == "fabric"]
            if sum(len(s.spec.devices or []) for s in slices) == len(CLASSES):
                break
            time.sleep(0.2)
        print(f"fabric dialect {args.dialect}", flush=True)
        for latency in (float(x) for x in args.latencies.split(",")):
            fabric.faults(attachLatencySeconds=latency, detachLatencySeconds=0)
            for kind in kinds:
                measure(core, res, kind, latency, args.pods)
    finally:
        for proc in (ctl, fabric, node):
            if proc is not None:
                proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
