"""The plugin's prepare latency under a burst of 100 pods, per node kind.

Setting: the local control plane (real apiserver, scheduler, controller
manager), the two nodes of the burst e2e test (tests/e2e/burst.py: a MIG
node and a GPU + VF node, each with the node agent and a real plugin), and
``--rounds`` bursts of 100 pods created at once, about three times what fits.
Per round the admitted pods are prepared while the others wait; then every
pod is deleted and the next burst starts from empty nodes.

What is timed, from the plugin's side: one NodePrepareResources call in the
plugin's servicer, as its "prepared N claim(s) in T ms" log line says (the
API read, the wait for the claim lock behind the calls before it, the
devices, the checkpoint and the CDI spec). The plugin's own
``patchbay_prepare_duration_seconds`` histogram (driver/metrics.py; the
work under the lock only, without the API read and the wait) is printed
next to it, its p99 as the bucket bound. Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import urllib.request
from pathlib import Path

from kubernetes import client, config

from tests.bench.contenders import percentile
from tests.bench.rundir import bench_dir
from tests.e2e.burst import (
    BurstNodes,
    burst_nodes,
    create_burst,
    create_templates,
    delete_pods,
    is_settled,
    settle_state,
)
from tests.e2e.helpers import wait_for
from tests.harness import cluster as localk8s
from tests.harness.cluster_proc import free_port
from tests.harness.simnode import SimNode, build_nvml_mock

NS = "burst"
# The plugin's line per call, written once the call's answer is (plugin/servers/dra.py).
CALL = re.compile(r"INFO plugin\.servers\.dra: prepared \d+ claim\(s\) in ([0-9.]+) ms")
HISTOGRAM = "patchbay_prepare_duration_seconds"


def call_latencies(log: Path, offset: int) -> list[float]:
    """Seconds each prepare call took in the plugin's servicer, for the calls
    logged after byte ``offset``."""
    with log.open(encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        return [float(m.group(1)) / 1000 for line in f if (m := CALL.search(line))]


def histogram(port: int) -> dict[float, float]:
    """Cumulative bucket counts of the plugin's prepare histogram (+Inf included)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[float, float] = {}
    for line in body.splitlines():
        if line.startswith(HISTOGRAM + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_p99(before: dict[float, float], after: dict[float, float]) -> tuple[int, str]:
    """Calls observed between the two readings and the bucket bound of their p99."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    bound = next((le for le, n in delta.items() if n >= 0.99 * total), float("inf"))
    return int(total), "none" if not total else f"<= {bound * 1000:g} ms"


def ms(values: list[float]) -> str:
    if not values:
        return "no calls"
    return (
        f"median {statistics.median(values) * 1000:.1f} ms, p99 "
        f"{percentile(values, 0.99) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms, "
        f"count {len(values)}"
    )


def one_burst(core: client.CoreV1Api, nodes: BurstNodes) -> tuple[float, int]:
    """Create the burst, wait until it settled; seconds to settle, pods Running."""
    started = time.monotonic()
    create_burst(core, NS, nodes)
    state = wait_for(
        "the burst settled",
        lambda: s if is_settled(s := settle_state(core, NS), nodes.pods, nodes) else None,
        timeout=300,
        interval=0.5,
    )
    return time.monotonic() - started, len(state.running)


def clear(core: client.CoreV1Api, res: client.ResourceV1Api) -> None:
    delete_pods(core, NS, [p.metadata.name for p in core.list_namespaced_pod(NS).items])
    wait_for("every pod gone", lambda: not core.list_namespaced_pod(NS).items, timeout=300)
    wait_for("every claim gone", lambda: not res.list_namespaced_resource_claim(NS).items, 120)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="burst_bench")
    parser.add_argument("--rounds", type=int, default=3, help="bursts of 100 pods, one by one")
    args = parser.parse_args(argv)
    build_nvml_mock()
    run = bench_dir("pbu-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        wait_for("ServiceAccount default", lambda: core.list_namespaced_service_account(NS).items)
        ports = {"mig": free_port(), "vf": free_port()}
        extra = {role: (f"--metrics-port={port}",) for role, port in ports.items()}
        with burst_nodes(cluster, res, core, run, extra) as nodes:
            create_templates(res, NS, nodes.kinds)
            calls: dict[str, list[float]] = {role: [] for role in nodes.by_role}
            hist: dict[str, list[tuple[int, str]]] = {role: [] for role in nodes.by_role}
            for i in range(args.rounds):
                offsets = {r: _size(n) for r, n in nodes.by_role.items()}
                before = {r: histogram(p) for r, p in ports.items()}
                seconds, running = one_burst(core, nodes)
                for role, node in nodes.by_role.items():
                    calls[role] += call_latencies(node.plugin.log_path, offsets[role])
                    hist[role].append(bucket_p99(before[role], histogram(ports[role])))
                print(f"burst {i + 1}: {nodes.pods} pods, {running} Running, the rest"
                      f" Unschedulable, settled in {seconds:.1f}s", flush=True)  # fmt: skip
                clear(core, res)
            for role in nodes.by_role:
                what = "MIG node (1g)" if role == "mig" else "GPU + VF node"
                print(f"prepare call, plugin side ({what}): {ms(calls[role])}")
                per_round = "; ".join(f"{n} calls p99 {p}" for n, p in hist[role])
                print(f"  {HISTOGRAM} (under the lock), per burst: {per_round}", flush=True)
    finally:
        cluster.down()


def _size(node: SimNode) -> int:
    return node.plugin.log_path.stat().st_size if node.plugin.log_path.exists() else 0


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
