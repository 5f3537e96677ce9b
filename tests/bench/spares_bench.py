"""Warm spares figures (issue 24): allocation-to-Running of a fabric GPU pod,
median and p99, with and without spares, and what the spares cost.

Setting: the local control plane, one GPU-less simulated node (node agent +
plugin), the simulated fabric with ``--gpus`` GPUs behind the node's
adapter0 attaching in ``--latency`` seconds, and the controller, started
afresh for each case with that case's spare settings (docs/fabric.md,
"Warm spares"):

- none: no spares; pods one after another;
- fixed: ``--spares-fixed=gpu:<model>=1``; each pod comes once a spare is
  ready (arrivals slower than an attach);
- demand: ``--spares-demand=gpu:*=1``; the first pod opens the node's
  window (it waits for its attach), each next one comes once a spare is ready;
- burst: fixed 1 and demand 2; ``--burst`` pods at once, more than the spares.

Each pod's claim asks for a spare first, else any fabric GPU (a
``firstAvailable`` list). Timed: the pod's claim allocated -> pod Running
(median, p99). The cost:
spare-seconds, the controller's ``patchbay_fabric_spares`` gauge (every
state) integrated over the case, sampled every 0.25 s. Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.bench.fabric_bench import ADAPTERS, allocated, bench_clients, p99
from tests.bench.rundir import bench_dir
from tests.harness import cluster as localk8s
from tests.harness.cluster_proc import free_port
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from tests.harness.simnode import PLUGIN_IDENTITY, SimNode, build_nvml_mock

MODEL = "H100-SXM5-80GB"  # the simulator's GPUs
SPARE_CEL = (
    '"spare" in device.attributes["patchbay.dev"] && device.attributes["patchbay.dev"].spare'
)
CASES: dict[str, tuple[str, ...]] = {
    "none": (),
    "demand": ("--spares-demand=gpu:*=1",),
    "fixed": (f"--spares-fixed=gpu:{MODEL}=1",),
    "burst": (f"--spares-fixed=gpu:{MODEL}=1", "--spares-demand=gpu:*=2"),
}


def spares(port: int) -> float:
    """The controller's spares, every state (0 while it cannot be read)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "patchbay_fabric_spares"
    )


class SpareSeconds(threading.Thread):
    """Integrates the spare gauge over time, in the background."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.total, self.halt = port, 0.0, threading.Event()

    def run(self) -> None:
        last = time.monotonic()
        while not self.halt.wait(0.25):
            now = time.monotonic()
            self.total += spares(self.port) * (now - last)
            last = now


def until(what: str, probe: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def spare_ready(res: Any) -> bool:
    """Whether the pool shows a spare (a variant with ``spare: true``)."""
    for s in res.list_resource_slice(field_selector="spec.driver=patchbay.dev").items:
        for d in s.spec.devices or ():
            a = (d.attributes or {}).get("spare")
            if s.spec.pool.name == "fabric" and a is not None and a.bool:
                return True
    return False


def create(core: Any, name: str) -> None:
    core.create_namespaced_pod("bench", {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "m", "image": "pause",
                                  "resources": {"claims": [{"name": "c"}]}}],
                 "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "gpu"}]},
    })  # fmt: skip


def timed(core: Any, res: Any, names: list[str]) -> list[float]:
    """Allocation -> Running of each pod (all created already); then deleted."""
    allocated_at: dict[str, float] = {}
    running_at: dict[str, float] = {}
    deadline = time.monotonic() + 180
    while len(running_at) < len(names) and time.monotonic() < deadline:
        for n in names:
            if n not in allocated_at and allocated(core, res, n):
                allocated_at[n] = time.monotonic()
            if n not in running_at and core.read_namespaced_pod(n, "bench").status.phase == (
                "Running"
            ):
                running_at[n] = time.monotonic()
        time.sleep(0.05)
    for n in names:
        core.delete_namespaced_pod(n, "bench")
    until("pods gone", lambda: not core.list_namespaced_pod("bench").items)
    return [running_at[n] - allocated_at.get(n, running_at[n]) for n in running_at]


def case(core: Any, res: Any, name: str, pods: int, burst: int, port: int) -> list[float]:
    if name == "burst":
        until("a spare", lambda: spare_ready(res))
        names = [f"burst-{i}" for i in range(burst)]
        for n in names:
            create(core, n)
        return timed(core, res, names)
    times: list[float] = []
    for i in range(pods):
        if name != "none" and (name == "fixed" or i > 0):
            until("a spare", lambda: spare_ready(res))
        create(core, f"{name}-{i}")
        times += timed(core, res, [f"{name}-{i}"])
    return times


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="spares_bench")
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--burst", type=int, default=6)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--latency", type=float, default=2.0, help="fabric attach seconds")
    parser.add_argument("--cases", default=",".join(CASES), help="of " + ",".join(CASES))
    args = parser.parse_args(argv)
    if unknown := sorted(set(args.cases.split(",")) - set(CASES)):
        parser.error(f"--cases: unknown {unknown}; known: {sorted(CASES)}")
    build_nvml_mock()
    run = bench_dir("pbs-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    node = fabric = ctl = None
    try:
        core, res = bench_clients(cluster, "bench")
        # A spare first (a prioritized list: docs/fabric.md), else any fabric GPU.
        res.create_namespaced_resource_claim_template("bench", {
            "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "dev", "firstAvailable": [
                {"name": "spare", "deviceClassName": "gpu.patchbay.dev",
                 "selectors": [{"cel": {"expression": SPARE_CEL}}]},
                {"name": "any", "deviceClassName": "gpu.patchbay.dev"},
            ]}]}}},
        })  # fmt: skip
        plugin_kc = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
        node = SimNode(cluster, "fab-0", "fabric-adapters", plugin_kc, (ADAPTERS,)).start()
        gpus = [f"gpu-{i}" for i in range(args.gpus)]
        sw = switch("sw0", [(node.name, "adapter0", node.host.dir)], gpus)
        fabric = FabricService(run / "fabric", {"id": "pcie0", "type": "PCIe", "switches": [sw]})
        fabric.start(attach_latency=args.latency)
        ctl_kc = cluster.kubeconfig_for(
            "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
        )
        print(f"spares: {args.gpus} GPUs, attach {args.latency:.1f}s", flush=True)
        for name in args.cases.split(","):
            port = free_port()
            flags = (*CASES[name], "--spares-cap=0.5", f"--metrics-port={port}")
            ctl = ControllerProcess(ctl_kc, fabric, run / f"controller-{name}.log", *flags)
            ctl.start(identity=f"bench-{name}")
            if name == "none":
                until("no fabric connections", lambda: not fabric.connections())
            meter = SpareSeconds(port)
            meter.start()
            started = time.monotonic()
            times = case(core, res, name, args.pods, args.burst, port)
            meter.halt.set()
            meter.join()
            wall = time.monotonic() - started
            print(
                f"spares {name:6}: allocation->Running median {statistics.median(times):.2f}s "
                f"p99 {p99(times):.2f}s (n={len(times)}); idle attached {meter.total:.0f} "
                f"spare-seconds in {wall:.0f}s ({meter.total / len(times):.1f} per pod)",
                flush=True,
            )
            ctl.stop()
            ctl = None
    finally:
        for proc in (ctl, fabric, node):
            if proc is not None:
                proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
