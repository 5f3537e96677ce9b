"""Node plugin figures: prepare/unprepare latency over the real socket, CPU
and fsyncs per pair, resident memory, and slice writes per minute at rest;
side by side with the reference driver when one is given.

Setting: the local control plane (real apiserver), our plugin on a simulated
4-GPU host with NVML through pynvml and the C mock; this script plays the
kubelet. Each pair prepares one single-GPU claim and unprepares it again.
With ``REFERENCE_PLUGIN=<binary>`` (or ``--reference``; see
``tests/bench/reference.py``) the reference driver's kubelet plugin runs in
the same control plane twice, with its client QPS as shipped (5, burst 10)
and raised (``--raised-qps``), under the same identity and ClusterRole as
ours, on nodes of their own; the three take turns in rounds. Without it the
table has our column only (CI has no checkout of the reference). The
floors (``tests.bench.floors``: a gRPC round trip to a trivial grpclib
server, the claim GET through our client, the RSS of the plugin's imports)
are sampled in the same rounds; each median is also printed above its floor.
The idle CPU of each plugin is read over ``--idle-seconds`` at rest with
``--held`` claims prepared (ours samples them for the Idle condition). With
``--baseline-tree <checkout>`` a second plugin of ours runs from that tree
(e.g. a worktree of the previous commit) as column ``base``, in the same
rounds: an A/B of a change on one machine at one time. Figures only:
nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.request
from pathlib import Path

from kubernetes import client, config

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.bench import reference
from tests.bench.contenders import (
    Contender,
    alternate,
    cpu_seconds,
    registered_endpoint,
    round_spread,
    rss_mb,
    syscall_table,
    table,
)
from tests.bench.floors import Floors, above_floor_table
from tests.bench.pooled import save
from tests.bench.rundir import bench_dir
from tests.harness import cluster as localk8s
from tests.harness.cluster_proc import free_port, stop_group
from tests.harness.simnode import PluginProcess, build_nvml_mock

NS = "bench"


def writes_total(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("patchbay_resourceslice_writes_total")
    )


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="plugin_bench")
    parser.add_argument("--iterations", type=int, default=200, help="timed pairs per plugin")
    parser.add_argument("--round", type=int, default=20, help="pairs per turn")
    parser.add_argument("--warmup", type=int, default=5, help="untimed pairs first")
    parser.add_argument("--fsync-pairs", type=int, default=20, help="untimed pairs under strace")
    parser.add_argument(
        "--idle-seconds",
        type=int,
        default=60,
        help="the time at rest, with --held claims prepared (idle CPU, slice writes)",
    )
    parser.add_argument("--held", type=int, default=2, help="claims prepared at rest per plugin")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--samples-out",
        type=Path,
        default=os.environ.get("PLUGIN_BENCH_SAMPLES") or None,
        help="a directory to write this run's latencies to (tests.bench.pooled pools runs)",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        default=Path(os.environ["REFERENCE_PLUGIN"])
        if os.environ.get("REFERENCE_PLUGIN")
        else None,
        help="dra-example-kubeletplugin binary (default: $REFERENCE_PLUGIN)",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="also run our plugin from this checkout (e.g. a git worktree of the "
        "previous commit) on a node of its own, as column 'base': an A/B of two of ours",
    )
    parser.add_argument("--raised-qps", type=float, default=1000.0)
    parser.add_argument("--raised-burst", type=int, default=2000)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse(argv)
    build_nvml_mock()
    run = bench_dir("pbb-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    ours_proc: PluginProcess | None = None
    others: list[int] = []
    bases: list[PluginProcess] = []
    contenders: list[Contender] = []
    floors: Floors | None = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        reference.apply_bench_rbac(api)
        kubeconfig = cluster.kubeconfig_for("bench-plugin", "bench-plugin", (reference.GROUP,))
        core.create_node({"metadata": {"name": "bench"}})
        host = SimHost.build(TOPOLOGIES["4x-h100"](), run / "host", name="bench")
        port = free_port()
        ours_proc = PluginProcess(
            "bench", host, kubeconfig, registry_dir=run / "reg", plugin_dir=run / "plug",
            cdi_root=run / "cdi", log_path=run / "plugin.log",
            extra_args=(f"--metrics-port={port}", f"--log-level={args.log_level}"),
        ).start()  # fmt: skip
        assert ours_proc.proc is not None
        pid = ours_proc.proc.pid
        ours = Contender("ours", pid, registered_endpoint(run / "reg", pid), "patchbay.dev",
                         "bench", NS, rss_start_mb=rss_mb(pid))  # fmt: skip
        contenders.append(ours)
        if args.baseline_tree is not None:
            core.create_node({"metadata": {"name": "bench-base"}})
            base_host = SimHost.build(TOPOLOGIES["4x-h100"](), run / "host-base", name="bench-base")
            base_proc = PluginProcess(
                "bench-base", base_host, kubeconfig, registry_dir=run / "reg-base",
                plugin_dir=run / "plug-base", cdi_root=run / "cdi-base",
                log_path=run / "plugin-base.log",
                # PYTHONSAFEPATH: the working directory (this tree) is not
                # put before PYTHONPATH (the baseline tree) by ``python -m``.
                extra_env={"PYTHONPATH": str(args.baseline_tree.resolve()), "PYTHONSAFEPATH": "1"},
                extra_args=(f"--metrics-port={free_port()}", f"--log-level={args.log_level}"),
            ).start()  # fmt: skip
            bases.append(base_proc)
            assert base_proc.proc is not None
            bpid = base_proc.proc.pid
            contenders.append(Contender("base", bpid, registered_endpoint(run / "reg-base", bpid),
                                        "patchbay.dev", "bench-base", NS,
                                        rss_start_mb=rss_mb(bpid)))  # fmt: skip
        if args.reference is not None:
            print(f"reference: {reference.describe(args.reference)}", flush=True)
            for label, (qps, burst) in (
                (f"ref qps {reference.SHIPPED_QPS[0]:g}", reference.SHIPPED_QPS),
                (f"ref qps {args.raised_qps:g}", (args.raised_qps, args.raised_burst)),
            ):
                node = f"bench-ref-{len(contenders)}"
                core.create_node({"metadata": {"name": node}})
                proc, registry = reference.start_reference(
                    args.reference, run / node, kubeconfig, node, qps, burst
                )
                others.append(proc.pid)
                endpoint = registered_endpoint(registry, proc.pid)
                contenders.append(Contender(label, proc.pid, endpoint, reference.DRIVER, node,
                                            NS, rss_start_mb=rss_mb(proc.pid)))  # fmt: skip
        need = args.iterations + args.warmup + args.fsync_pairs
        for c in contenders:
            c.make_claims(res, need)
            c.run(args.warmup, record=False)
        floors = Floors(run, kubeconfig, NS, ours.claims[-1][0])
        alternate([*contenders, floors], args.iterations, args.round)
        for c in contenders:
            c.count_fsyncs(args.fsync_pairs)
        pairs = len(ours.prepare_ms)
        print(f"{pairs} pairs per plugin, rounds of {args.round}, alternating; "
              f"fsyncs: {ours.fsync_method}, {args.fsync_pairs} untimed pairs")  # fmt: skip
        print(table(contenders, [c.label for c in contenders[1:]]), flush=True)
        print(round_spread(contenders, [c.label for c in contenders[1:]], args.round))
        print(floors.describe())
        print(above_floor_table(contenders, floors, [c.label for c in contenders[1:]]))
        print(f"RSS above the import floor (ours): "
              f"{rss_mb(ours.pid) - floors.import_rss_mb:.1f} MB", flush=True)  # fmt: skip
        print(syscall_table(contenders), flush=True)
        if args.samples_out is not None:
            save(args.samples_out / f"run-{time.strftime('%Y%m%dT%H%M%S')}.json", contenders)
        for c in contenders:
            c.hold(res, [f"gpu-{i + 1}" for i in range(args.held)])
        before = writes_total(port)
        cpu = {c.label: cpu_seconds(c.pid) for c in contenders}
        time.sleep(args.idle_seconds)
        idle = {c.label: (cpu_seconds(c.pid) - cpu[c.label]) * 100 / args.idle_seconds
                for c in contenders}  # fmt: skip
        after = writes_total(port)
        per_min = (after - before) * 60 / args.idle_seconds
        print(f"idle CPU, {args.idle_seconds} s at rest with {args.held} claims prepared "
              f"(ours samples them every --idle-sample-interval): "
              + ", ".join(f"{k} {v:.3f} %" for k, v in idle.items()))  # fmt: skip
        print(
            f"slice writes at rest (ours): {after - before:.0f} in {args.idle_seconds}s"
            f" ({per_min:.1f} per minute; {before:.0f} writes since start)"
        )
    finally:
        for c in contenders:
            c.close()
        if floors is not None:
            floors.close()
        for other in others:
            stop_group(other, "reference plugin")
        for base in bases:
            base.stop()
        if ours_proc is not None:
            ours_proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
