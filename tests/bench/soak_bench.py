"""Soak: pod churn on a MIG node and a fabric node for minutes, watching for growth.

Setting: the local control plane, a MIG node (2 x H100, ``--mig-gpus=all``)
and a GPU-less fabric node (node agents + real plugins), the simulated
fabric (gpu-0 and gpu-1 behind the node's adapter0, gpu-2 behind adapter1)
and the real controller. For ``--soak-seconds`` (env ``SOAK_SECONDS``,
default 600) batches of pods (four 1g and two 2g MIG partitions, two fabric
GPUs) are created, waited for until Running, deleted, and waited for until
their claims are gone: every batch creates and destroys MIG instances and
attaches and detaches fabric GPUs.

Printed at the start, every ``--interval`` seconds and at the end: resident
memory and open file descriptors of both plugins and the controller
(``/proc``), the summed generations of each pool's ResourceSlices (a rise
is a slice rewrite), the writes the apiserver served in the interval by
resource (its request counter, all clients) and the pods churned. The goal
is no growth beyond noise. Figures only: nothing is asserted.

``--heap`` (env ``SOAK_HEAP=1``) runs the plugins and the controller with
Python's allocation tracing on and prints each one's heap summary
(``driver.heapsummary``, asked for with SIGUSR2) after the warm-up and at
every sample: the allocation sites that grew in the interval, to tell
objects that pile up (the same site growing every interval) from caches
that fill once and from an allocator keeping its arenas. Tracing costs memory of its
own: the RSS figures of such a run are not comparable with a plain one.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.bench.contenders import rss_mb
from tests.bench.fabric_bench import ADAPTERS, bench_clients, write_counts
from tests.bench.rundir import bench_dir
from tests.e2e.helpers import wait_for
from tests.harness import cluster as localk8s
from tests.harness.cluster_proc import free_port
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from tests.harness.simnode import PLUGIN_IDENTITY, SimNode, build_nvml_mock

NS = "soak"
BATCH = (("mig-1g", 4), ("mig-2g", 2), ("fabric", 2))
CLASSES = {"mig-1g": "mig-1g.patchbay.dev", "mig-2g": "mig-2g.patchbay.dev",
           "fabric": "gpu.patchbay.dev"}  # fmt: skip


def fds(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def generations(res: client.ResourceV1Api) -> dict[str, int]:
    """Summed ``metadata.generation`` of our ResourceSlices, by pool."""
    out: dict[str, int] = {}
    for s in res.list_resource_slice(field_selector="spec.driver=patchbay.dev").items:
        out[s.spec.pool.name] = out.get(s.spec.pool.name, 0) + int(s.metadata.generation or 0)
    return out


class Soak:
    def __init__(self, core: client.CoreV1Api, res: client.ResourceV1Api, nodes: dict[str, str]):
        self.core, self.res, self.nodes = core, res, nodes
        self.churned = 0
        self.batches = 0

    def templates(self) -> None:
        for name, cls in CLASSES.items():
            req = {"name": "dev", "exactly": {"deviceClassName": cls}}
            body = {"metadata": {"name": name},
                    "spec": {"spec": {"devices": {"requests": [req]}}}}  # fmt: skip
            self.res.create_namespaced_resource_claim_template(NS, body)

    def pod(self, name: str, kind: str) -> dict[str, Any]:
        node = self.nodes["fabric" if kind == "fabric" else "mig"]
        return {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "m", "image": "pause",
                                "resources": {"claims": [{"name": "dev"}]}}],
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": kind}],
            },
        }  # fmt: skip

    def batch(self) -> None:
        """One batch: created together, all Running, deleted, claims gone."""
        self.batches += 1
        names = [(f"b{self.batches}-{k}-{i}", k) for k, n in BATCH for i in range(n)]
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda nk: self.core.create_namespaced_pod(NS, self.pod(*nk)), names))

        def all_running() -> bool:
            pods = self.core.list_namespaced_pod(NS).items
            return len(pods) == len(names) and all(p.status.phase == "Running" for p in pods)

        wait_for(f"batch {self.batches} Running", all_running, timeout=180, interval=0.2)
        self.core.delete_collection_namespaced_pod(NS)
        wait_for("pods gone", lambda: not self.core.list_namespaced_pod(NS).items, 180, 0.2)
        wait_for(
            "claims gone", lambda: not self.res.list_namespaced_resource_claim(NS).items, 180, 0.2
        )
        self.churned += len(names)


def sample(label: str, procs: dict[str, int], soak: Soak, last: dict[str, Any]) -> None:
    now = time.monotonic()
    gens, writes = generations(soak.res), write_counts(soak.core.api_client)
    mem = ", ".join(f"{n} {rss_mb(p):.1f} MB/{fds(p)} fds" for n, p in procs.items())
    print(f"[{label}] RSS/fds: {mem}", flush=True)
    minutes = (now - last["t"]) / 60 if last else 0.0
    if minutes > 0.1:  # a rate over a few seconds (the end right after a sample) is noise
        dgen = {k: v - last["gens"].get(k, 0) for k, v in gens.items()}
        dw = {k: v - last["writes"].get(k, 0.0) for k, v in writes.items()}
        dw = {k: v for k, v in sorted(dw.items()) if v}
        print(
            f"    per minute: pods {(soak.churned - last['churned']) / minutes:.1f}, slice "
            "generations " + ", ".join(f"{k} +{v / minutes:.1f}" for k, v in sorted(dgen.items()))
            + "; API writes " + ", ".join(f"{k} {v / minutes:.0f}" for k, v in dw.items()),
            flush=True,
        )  # fmt: skip
    last.update(t=now, gens=gens, writes=writes, churned=soak.churned)


def heap(when: str, procs: dict[str, int], logs: dict[str, Path]) -> None:
    """Ask each process for its heap summary (SIGUSR2) and print it from its log."""
    sizes = {n: logs[n].stat().st_size for n in procs}
    for pid in procs.values():
        os.kill(pid, signal.SIGUSR2)
    for name in procs:

        def lines(name: str = name) -> list[str]:
            with logs[name].open("rb") as f:
                f.seek(sizes[name])
                text = f.read().decode(errors="replace")
            return [ln.split("heap: ", 1)[1] for ln in text.splitlines() if "heap: " in ln]

        wait_for(f"the heap summary of the {name}", lines, 30)
        time.sleep(0.5)  # one callback logs the whole summary: let it finish
        got = lines()
        print(f"[heap {when}] {name}:", flush=True)
        for line in got:
            print(f"    {line}", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="soak_bench")
    parser.add_argument("--soak-seconds", type=float,
                        default=float(os.environ.get("SOAK_SECONDS", "600")))  # fmt: skip
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--heap", action="store_true",
                        default=os.environ.get("SOAK_HEAP", "") not in ("", "0"))  # fmt: skip
    args = parser.parse_args(argv)
    build_nvml_mock()
    run = bench_dir("pbs-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    started: list[Any] = []
    try:
        core, res = bench_clients(cluster, NS)
        plugin_kc = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
        metrics = f"--metrics-port={free_port()}"
        mig = SimNode(cluster, "soak-mig", "2-gpus", plugin_kc, ("--mig-gpus=all", metrics))
        fab = SimNode(cluster, "soak-fab", "fabric-adapters", plugin_kc,
                      (ADAPTERS, f"--metrics-port={free_port()}"))  # fmt: skip
        traced = {"PYTHONTRACEMALLOC": "1"} if args.heap else {}
        for node in (mig, fab):
            node.plugin.extra_env.update(traced)
        started += [mig.start(), fab.start()]
        fabric = FabricService(run / "fabric", {"switches": [
            switch("sw0", [(fab.name, "adapter0", fab.host.dir)], ["gpu-0", "gpu-1"]),
            switch("sw1", [(fab.name, "adapter1", fab.host.dir)], ["gpu-2"]),
        ]}).start()  # fmt: skip
        started.append(fabric)
        ctl_kc = cluster.kubeconfig_for(
            "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
        )
        ctl = ControllerProcess(ctl_kc, fabric, run / "controller.log",
                                f"--metrics-port={free_port()}")  # fmt: skip
        ctl.env.update(traced)
        started.append(ctl.start())
        wait_for(
            "the MIG node's and the fabric's slices",
            lambda: {mig.name, "fabric"} <= set(generations(res)),
            180,
        )
        soak = Soak(core, res, {"mig": mig.name, "fabric": fab.name})
        soak.templates()
        soak.batch()  # warm-up: every code path once before the first figures
        warm = soak.churned
        procs = {n: p.proc.pid for n, p in (("mig plugin", mig.plugin), ("fabric plugin",
                 fab.plugin), ("controller", ctl)) if p.proc is not None}  # fmt: skip
        logs = {"mig plugin": mig.plugin.log_path, "fabric plugin": fab.plugin.log_path,
                "controller": ctl.log_path}  # fmt: skip
        if args.heap:
            heap("after the warm-up", procs, logs)
        last: dict[str, Any] = {}
        sample("start", procs, soak, last)
        t0 = time.monotonic()
        next_sample = t0 + args.interval
        while time.monotonic() - t0 < args.soak_seconds:
            soak.batch()
            if time.monotonic() >= next_sample:
                when = f"{(time.monotonic() - t0) / 60:.1f} min"
                sample(when, procs, soak, last)
                if args.heap:
                    heap(f"{when}, grown in the interval", procs, logs)
                next_sample += args.interval
        sample("end", procs, soak, last)
        if args.heap:
            heap("at the end, grown since the last one", procs, logs)
        print(f"churned {soak.churned - warm} pods in {soak.batches - 1} batches over "
              f"{(time.monotonic() - t0) / 60:.1f} min (after one warm-up batch)")  # fmt: skip
    finally:
        for proc in reversed(started):
            proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
