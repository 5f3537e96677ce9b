"""Scheduler figures: how fast the real kube-scheduler allocates claims and
binds pods while a large fabric pool, published as our controller publishes
it, is present.

Why: the scheduler evaluates a class's CEL selectors on every device of a
slice that has any device on the node being tried, before it checks each
device's node, and a fabric pool holds every fabric GPU once per node that
can reach it (node-major slices of at most 64 devices, a counter per GPU,
binding conditions), so it can cost every claim in the cluster, also claims
for node-local GPUs only. Kubernetes 1.36 fell to about 3 pods/s with
partitionable pools; we measure before claiming the design scales, and
``--layout gpu-major`` shows what the first, GPU-major layout cost.

Setting: the local control plane (real apiserver, scheduler and
controller-manager); hand-made Ready nodes without kubelets (a thread renews
their Leases and Ready heartbeats), each with a local pool of GPUs as the
plugin publishes it and a fabric adapter; the fabric pool built by the
controller's own pool and slice builders, for each pool size. Per size, a
burst of pods, each with a claim from a template for `local-gpu.patchbay.dev`,
timed from creation to bound (spec.nodeName set); and, with a non-empty
fabric pool, a burst for `gpu.patchbay.dev` (local or fabric) timed from
creation to claim allocated, because fabric claims wait in PreBind for an
attach no controller does here. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.bench.pod_bursts import NS, clean, timed_pods
from tests.bench.rundir import bench_dir
from tests.bench.sched_world import (
    FABRIC_POOL,
    Heartbeat,
    fabric_spec,
    local_slices,
    make_nodes,
    publish_fabric,
)
from tests.harness import cluster as localk8s

REPO = Path(__file__).resolve().parents[2]
ROUND_TIMEOUT = 180.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- bursts of pods ------------------------------------------------------------


@dataclasses.dataclass
class Burst:
    latencies: list[float]
    span: float  # first creation -> last pod done
    fabric: int  # claims allocated a fabric device
    cpu: float  # scheduler CPU seconds from the template's creation to the last pod done


def one_of(*classes: str) -> dict[str, Any]:
    """A request for one device of the first class that can serve it (one: `exactly`)."""
    if len(classes) == 1:
        return {"name": "gpu", "exactly": {"deviceClassName": classes[0]}}
    subs = [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)]
    return {"name": "gpu", "firstAvailable": subs}


def burst(
    core: client.CoreV1Api, res: client.ResourceV1Api, tag: str, request: dict[str, Any],
    pods: int, until: str, cpu: Callable[[], float],
) -> Burst:  # fmt: skip
    """Create `pods` pods at once; time each one to bound or to claim allocated."""
    devices = {"requests": [request]}
    created, done, cpu_used = timed_pods(core, res, tag, devices, pods, until, cpu, ROUND_TIMEOUT)
    fabric = sum(
        1
        for c in res.list_namespaced_resource_claim(NS).items
        if c.status and c.status.allocation
        for r in c.status.allocation.devices.results or []
        if r.pool == FABRIC_POOL
    )
    clean(core, res, tag)
    latencies = [done[n] - created[n] for n in done]
    span = max(done.values()) - min(created.values()) if done else float("nan")
    return Burst(latencies, span, fabric, cpu_used)


def figures(b: Burst, pods: int, what: str, done: str) -> str:
    if not b.latencies:
        return f"none {done} within {ROUND_TIMEOUT:.0f}s"
    n = len(b.latencies)
    missing = f" ({pods - n} not {done} within {ROUND_TIMEOUT:.0f}s)" if n < pods else ""
    return (
        f"{n / b.span:.1f} pods/s, {what} latency median "
        f"{statistics.median(b.latencies):.2f}s p99 {percentile(b.latencies, 0.99):.2f}s, "
        f"scheduler CPU {b.cpu / pods * 1000:.0f} ms/pod{missing}"
    )


def scheduler_log_summary(log: Path) -> str:
    """Warnings/errors and slow-cycle traces in the scheduler's log."""
    if not log.exists():
        return "scheduler log: missing"
    lines = log.read_text(errors="replace").splitlines()
    bad = [ln for ln in lines if re.match(r"^[EW]\d{4} ", ln)]
    traces = [ln for ln in lines if "Trace[" in ln and "total time" in ln]
    notable = [ln for ln in lines if re.search(r"incomplete|cel|cost", ln, re.IGNORECASE)]
    out = f"scheduler log: {len(bad)} warning/error lines, {len(traces)} slow-trace lines"
    out += f", {len(notable)} mentioning incomplete/CEL/cost"
    seen: set[str] = set()
    for ln in bad + notable:
        msg = ln.split("] ", 1)[-1][:160]
        if msg not in seen and len(seen) < 4:
            seen.add(msg)
            out += f"\n  {msg}"
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="sched_bench")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--local-gpus", type=int, default=2)
    parser.add_argument("--fabric-gpus", default="0,64,256")
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--layout", choices=("node-major", "gpu-major"), default="node-major")
    args = parser.parse_args(argv)
    run = bench_dir("pbs-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    beat = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        for name in ("gpu.patchbay.dev.yaml", "local-gpu.patchbay.dev.yaml"):
            for doc in yaml.safe_load_all((REPO / "deviceclasses" / name).read_text()):
                res.create_device_class(doc)
        core.create_namespace({"metadata": {"name": NS}})
        nodes = [f"node-{i:03d}" for i in range(args.nodes)]
        make_nodes(api, nodes)
        beat = Heartbeat(api, nodes)
        beat.start()
        for node in nodes:
            for body in local_slices(node, args.local_gpus):
                res.create_resource_slice(body, _preload_content=False)
        while not core.list_namespaced_service_account(NS).items:
            time.sleep(0.2)  # pods need the namespace's default ServiceAccount
        print(
            f"{args.nodes} nodes x {args.local_gpus} local GPUs, {args.pods} pods per round",
            flush=True,
        )
        cpu = functools.partial(cpu_seconds, cluster.pids()["kube-scheduler"])
        previous: list[str] = []
        for generation, gpus in enumerate((int(x) for x in args.fabric_gpus.split(",")), 1):
            start = time.monotonic()
            spec = fabric_spec(gpus, nodes, args.layout)
            built = time.monotonic() - start
            previous, api_s = publish_fabric(res, spec, generation, previous)
            n_dev = len(spec.devices)
            pool = f"fabric pool {n_dev} devices ({len(previous)} {args.layout} slices)"
            print(
                f"{pool}: {gpus} GPUs x {args.nodes} nodes published in {api_s:.2f}s "
                f"(built in {built:.2f}s)",
                flush=True,
            )
            time.sleep(2)  # the scheduler's informer takes the new slices in
            local = one_of("local-gpu.patchbay.dev")
            b = burst(core, res, f"local-{gpus}", local, args.pods, "bound", cpu)
            figs = figures(b, args.pods, "bind", "bound")
            print(f"{pool}: {args.pods} pods local-gpu: {figs}", flush=True)
            rounds = {  # the fallback: the scheduler scores nodes by the subrequest used
                "gpu (local or fabric)": one_of("gpu.patchbay.dev"),
                "firstAvailable [local-gpu, gpu]": one_of(
                    "local-gpu.patchbay.dev", "gpu.patchbay.dev"
                ),
            }
            for i, (what, request) in enumerate(rounds.items() if n_dev else ()):
                b = burst(core, res, f"any{i}-{gpus}", request, args.pods, "allocated", cpu)
                figs = figures(b, args.pods, "allocation", "allocated")
                print(f"{pool}: {args.pods} pods {what}: {figs}; {b.fabric} got a fabric device")
        untainted = sum(not n.spec.taints for n in core.list_node().items)
        print(f"heartbeat: {beat.errors} failed renewals, {untainted} nodes untainted at the end")
        print(scheduler_log_summary(cluster.run_dir / "logs" / "kube-scheduler.log"))
        print(f"logs: {cluster.run_dir / 'logs'}")
    finally:
        if beat is not None:
            beat.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
