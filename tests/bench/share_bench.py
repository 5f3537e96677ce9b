"""Fractional-GPU figures: N pods sharing GPUs on M nodes, scheduled by the
upstream scheduler alone.

Why: a GPU-sharing stack that ran its own scheduler and wrote per-node
annotations on a timer tripled apiserver CPU and raised etcd traffic
twentyfold on a large cluster. Here the accounting is the 1.37 allocator's
consumable capacity; we measure what that costs the API.

Setting: the local control plane, M simulated 8 x A100-80GB nodes (node agent
+ plugin, ``--shared-gpus=all``), a claim template for
``shared-gpu.patchbay.dev`` asking ``memory`` (10 GiB by default: 8 shares
per GPU). A burst of N pods is created at once; we time creation to the last
pod bound (pods scheduled per second) and to the last one Running, and count
the writes the apiserver served meanwhile (its request counter, all clients)
by resource, per pod. Then, with the pods running, writes per minute at rest.
``--exclusive`` runs the same burst with whole GPUs (``gpu.patchbay.dev``,
so N <= 8 M) as the baseline. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.bench.fabric_bench import write_counts
from tests.bench.rundir import bench_dir
from tests.harness import cluster as localk8s
from tests.harness.simnode import PLUGIN_IDENTITY, SimNode, apply_rbac, build_nvml_mock

REPO = Path(__file__).resolve().parents[2]
NS = "bench"
SHARED = "shared-gpu.patchbay.dev"


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after) if after[k] != before.get(k)}


def wait_pods(core: Any, n: int, done: Any, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(NS).items
        if sum(1 for p in pods if done(p)) >= n:
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {n} pods ready after {timeout:.0f}s")


def request(memory: str, exclusive: bool) -> dict[str, Any]:
    if exclusive:
        return {"deviceClassName": "gpu.patchbay.dev"}
    return {"deviceClassName": SHARED, "capacity": {"requests": {"memory": memory}}}


def setup(cluster: Any, nodes: int, memory: str, exclusive: bool) -> tuple[Any, Any, list[SimNode]]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    apply_rbac(cluster.kubeconfig, "plugin.yaml")
    for name in (SHARED, "gpu.patchbay.dev"):
        for doc in yaml.safe_load_all((REPO / "deviceclasses" / f"{name}.yaml").read_text()):
            res.create_device_class(doc)
    core.create_namespace({"metadata": {"name": NS}})
    while not core.list_namespaced_service_account(NS).items:
        time.sleep(0.2)  # pods need the namespace's default ServiceAccount
    res.create_namespaced_resource_claim_template(NS, {
        "metadata": {"name": "share"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": request(memory, exclusive)}]}}},
    })  # fmt: skip
    kc = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    sims = [
        SimNode(cluster, f"sh-{i}", "8x-a100", kc, ("--shared-gpus=all",)) for i in range(nodes)
    ]
    for sim in sims:
        sim.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        shared = [
            d
            for s in res.list_resource_slice().items
            for d in s.spec.devices or []
            if d.attributes["type"].string == "shared-gpu"
        ]
        if len(shared) == 8 * nodes:
            break
        time.sleep(0.2)
    return core, res, sims


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="share_bench")
    parser.add_argument("--pods", type=int, default=64, help="N pods")
    parser.add_argument("--nodes", type=int, default=2, help="M simulated 8-GPU nodes")
    parser.add_argument("--memory", default="10Gi", help="memory each pod's claim asks")
    parser.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest")
    parser.add_argument("--exclusive", action="store_true", help="whole GPUs: the baseline")
    args = parser.parse_args(argv)
    build_nvml_mock()
    run = bench_dir("pbs-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    sims: list[SimNode] = []
    try:
        core, _res, sims = setup(cluster, args.nodes, args.memory, args.exclusive)
        time.sleep(2)  # let the publishers settle before counting
        before = write_counts(core.api_client)
        start = time.monotonic()
        for i in range(args.pods):
            core.create_namespaced_pod(NS, {
                "metadata": {"name": f"p-{i}"},
                "spec": {"containers": [{"name": "m", "image": "pause",
                                          "resources": {"claims": [{"name": "c"}]}}],
                         "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "share"}]},
            })  # fmt: skip
        bound = wait_pods(core, args.pods, lambda p: bool(p.spec.node_name), 300)
        running = wait_pods(core, args.pods, lambda p: p.status.phase == "Running", 300)
        writes = delta(write_counts(core.api_client), before)
        print(
            f"{args.pods} pods "
            + ("with a whole GPU each" if args.exclusive else f"sharing GPUs ({args.memory} each)")
            + f" on {args.nodes} nodes: "
            f"{args.pods / (bound - start):.1f} pods scheduled/s (creation of the first to the "
            f"last bound: {bound - start:.2f}s), last Running after {running - start:.2f}s"
        )
        print(
            "apiserver writes per pod (all clients, burst to all Running): "
            + ", ".join(f"{k} {v / args.pods:.2f}" for k, v in writes.items())
        )
        rest_from = write_counts(core.api_client)
        time.sleep(args.rest)
        rest = delta(write_counts(core.api_client), rest_from)
        per_min = {k: v * 60.0 / args.rest for k, v in rest.items()}
        slices = per_min.get("resourceslices", 0.0)
        print(
            f"writes per minute at rest ({args.rest:.0f}s, {args.pods} pods running): "
            f"resourceslices {slices:.1f}; all: "
            + (", ".join(f"{k} {v:.1f}" for k, v in per_min.items()) or "none")
        )
    finally:
        for sim in sims:
            sim.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
