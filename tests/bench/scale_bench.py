"""Scale figures (issue 26): what our slices cost the control plane and the
scheduler at hundreds and thousands of nodes.

Why: platform teams judge a GPU-sharing system by its cost on their control
plane. Dynamic MIG makes our pools large (about a hundred devices per
4-GPU node), and the scheduler's allocator walks those devices for every
claim; this bench measures that cost, by size, before the slices are made
leaner.

Setting, per size (a fresh control plane each): the real etcd, apiserver,
scheduler and controller-manager (``tests.harness.cluster``); N hollow
nodes (``scale_cluster``: Node objects with a Lease renewed as a kubelet
renews it, at a bounded write rate); each node's pool as our plugin builds
it on a simulated 4 x H100 host with dynamic MIG, fractional shares and the
VFs on the GPUs' PCIe roots (``scale_pool``: the plugin's device families
and slice builder); the fabric pool as the controller builds it (every
fabric GPU reachable from every node, ``sched_world.fabric_spec``). First
the same nodes with plain 4-GPU pools (MIG, shares and VFs off) for the
plain-GPU baseline; then the full pools, and a burst of pods per workload
kind, each timed from creation to bound (fabric GPUs: to claim allocated,
since nothing attaches here). Then one real plugin process on a simulated
host of its own, started against the loaded control plane: its time from
start to its pool published, and its CPU and API requests (audit log) over
a rest window. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import calendar
import functools
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.bench import reference
from tests.bench.pod_bursts import NS, clean, timed_pods
from tests.bench.scale_bytes import byte_report
from tests.bench.scale_cluster import (
    LeaseBeat,
    etcd_db_mb,
    etcd_url,
    json_bytes,
    make_hollow_nodes,
    rss_mb,
    served_slices,
    untainted,
    watches,
)
from tests.bench.scale_pool import MIG_NODE, PLAIN_NODE, HostPools, NodeFlavor, plugin_args
from tests.bench.sched_bench import cpu_seconds, percentile
from tests.bench.sched_world import fabric_spec, publish_fabric
from tests.e2e.helpers import make_node
from tests.harness import cluster as localk8s
from tests.harness.simnode import PluginProcess, apply_deviceclasses, build_nvml_mock

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deviceclasses" / "examples"
ROUND_TIMEOUT = 240.0
Obj = dict[str, Any]


def example(name: str) -> Obj:
    """The claim spec (``spec.devices``) of an example's ResourceClaimTemplate."""
    for doc in yaml.safe_load_all((EXAMPLES / name).read_text()):
        if doc and doc.get("kind") == "ResourceClaimTemplate":
            devices: Obj = doc["spec"]["spec"]["devices"]
            return devices
    raise ValueError(f"{name}: no ResourceClaimTemplate")


def kinds() -> dict[str, tuple[Obj, str]]:
    """Workload kind -> (claim devices, what a pod waits for)."""
    local = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "local-gpu.patchbay.dev"}}]
    }
    return {
        "whole GPU": (local, "bound"),
        "MIG 1g": (example("mig-1g.yaml"), "bound"),
        "MIG 3g": (example("mig-3g.yaml"), "bound"),
        "GPU+VF pair": (example("gpu-vf-pair.yaml"), "bound"),
        "fractional share": (example("four-inference-replicas.yaml"), "bound"),
        "fabric GPU": (example("fabric-gpu.yaml"), "allocated"),
    }


def burst(
    core: client.CoreV1Api, res: client.ResourceV1Api, tag: str, devices: Obj, pods: int,
    until: str, cpu: Callable[[], float],
) -> tuple[list[float], float, float]:  # fmt: skip
    """``pods`` pods at once, each with a claim from one template: latencies,
    span (first creation to last done), scheduler CPU seconds."""
    created, done, used = timed_pods(core, res, tag, devices, pods, until, cpu, ROUND_TIMEOUT)
    clean(core, res, tag)
    span = max(done.values()) - min(created.values()) if done else float("nan")
    return [done[n] - created[n] for n in done], span, used


def kind_row(what: str, pods: int, lat: list[float], span: float, cpu_s: float) -> str:
    if not lat:
        return f"  {what:18s} none done within {ROUND_TIMEOUT:.0f}s"
    short = f" ({pods - len(lat)} not done)" if len(lat) < pods else ""
    return (
        f"  {what:18s} {len(lat):4d} pods {len(lat) / span:7.1f} pods/s  p50 "
        f"{statistics.median(lat):6.2f}s p99 {percentile(lat, 0.99):6.2f}s  scheduler CPU "
        f"{cpu_s / pods * 1000:6.1f} ms/pod{short}"
    )


def kind_round(
    core: client.CoreV1Api, res: client.ResourceV1Api, what: str, devices: Obj, pods: int,
    until: str, cpu: Callable[[], float],
) -> None:  # fmt: skip
    tag = re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")
    lat, span, used = burst(core, res, tag, devices, pods, until, cpu)
    print(kind_row(what, pods, lat, span, used), flush=True)


def publish_pools(
    res: client.ResourceV1Api, pools: HostPools, nodes: list[Obj], flavor: NodeFlavor,
    previous: list[str],
) -> tuple[list[str], float]:  # fmt: skip
    """Replace every node's pool; the slice names and the seconds it took."""
    start = time.monotonic()
    for name in previous:
        res.delete_resource_slice(name, _preload_content=False)
    names = []
    for node in nodes:
        for body in pools.slices(node, flavor):
            res.create_resource_slice(body, _preload_content=False)
            names.append(body["metadata"]["name"])
    return names, time.monotonic() - start


def storage_report(api: client.ApiClient, res: client.ResourceV1Api, pids: dict[str, int],
                   nodes: list[Obj]) -> None:  # fmt: skip
    items = served_slices(res)
    per_node = served_slices(res, nodes[0]["metadata"]["name"])
    local = [s for s in items if s["spec"].get("nodeName")]
    fabric = [s for s in items if not s["spec"].get("nodeName")]
    node_bytes = sum(json_bytes(s) for s in per_node)
    devices = sum(len(s["spec"].get("devices") or []) for s in per_node)
    managed = sum(json_bytes({"m": s["metadata"].get("managedFields")}) for s in per_node)
    total, in_use = etcd_db_mb(etcd_url(pids["kube-apiserver"]))
    all_w, slice_w = watches(api)
    print(f"  stored per node: {len(per_node)} slices, {devices} devices, {node_bytes / 1e3:.1f} kB"
          f" as served ({managed / 1e3:.1f} kB of it managed fields), "
          f"{node_bytes / 4 / 1e3:.1f} kB per MIG-capable GPU")  # fmt: skip
    print(f"  all slices: {len(local)} node-local ({sum(map(json_bytes, local)) / 1e6:.1f} MB), "
          f"{len(fabric)} fabric ({sum(map(json_bytes, fabric)) / 1e6:.1f} MB)")  # fmt: skip
    print(f"  apiserver RSS {rss_mb(pids['kube-apiserver']):.0f} MB, etcd RSS "
          f"{rss_mb(pids['etcd']):.0f} MB, etcd DB {total:.1f} MB ({in_use:.1f} MB in use), "
          f"scheduler RSS {rss_mb(pids['kube-scheduler']):.0f} MB")  # fmt: skip
    print(f"  watches at the apiserver: {all_w} ({slice_w} on resourceslices)", flush=True)


def audit_requests(log: Path | None, user: str, since: float, until: float) -> int | None:
    """Requests by ``user`` received in [since, until) (epoch seconds), from the audit log."""
    if log is None or not log.exists():
        return None
    count = 0
    with log.open() as f:
        for line in f:
            if user not in line or '"ResponseComplete"' not in line:
                continue
            ev = json.loads(line)
            if ev.get("user", {}).get("username") != user:
                continue
            ts = ev["requestReceivedTimestamp"].split(".")[0].rstrip("Z")
            got = calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%S"))
            if since <= got < until:
                count += 1
    return count


def whole_pool(slices: list[Obj]) -> int:
    """Devices in a pool once all its slices of the newest generation are there, else 0."""
    if not slices:
        return 0
    pool = max((s["spec"]["pool"] for s in slices), key=lambda p: int(p["generation"]))
    mine = [s for s in slices if s["spec"]["pool"]["generation"] == pool["generation"]]
    if len(mine) < int(pool["resourceSliceCount"]):
        return 0
    return sum(len(s["spec"].get("devices") or []) for s in mine)


def real_plugin(cluster: localk8s.LocalCluster, api: client.ApiClient, run: Path,
                expected: int, rest: float) -> None:  # fmt: skip
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    reference.apply_bench_rbac(api)
    kubeconfig = cluster.kubeconfig_for("bench-plugin", "bench-plugin", (reference.GROUP,))
    node = "scale-plugin"
    make_node(core, node, {"kubernetes.io/hostname": node})
    host = SimHost.build(TOPOLOGIES["2x-h100-nic"](), run / "plugin-host", name=node)
    plugin = PluginProcess(
        node, host, kubeconfig, registry_dir=run / "reg", plugin_dir=run / "plug",
        cdi_root=run / "cdi", log_path=run / "plugin.log",
        extra_args=("--log-level=info", *plugin_args(MIG_NODE, run / "vf.yaml")),
    )  # fmt: skip
    start = time.monotonic()
    plugin.start()
    try:
        assert plugin.proc is not None
        seen = 0
        while not seen:  # the whole pool: every slice of its generation, with devices
            if time.monotonic() - start > 180 or not plugin.alive:
                print(f"  real plugin: no pool published after {time.monotonic() - start:.0f}s"
                      f"\n{plugin.log_tail(20)}")  # fmt: skip
                return
            time.sleep(0.1)
            seen = whole_pool(served_slices(res, node))
        took = time.monotonic() - start
        time.sleep(5)  # settle: the rest window starts after the start-up's last requests
        cpu0, t0, wall0 = cpu_seconds(plugin.proc.pid), time.monotonic(), time.time()
        time.sleep(rest)
        cpu1, t1, wall1 = cpu_seconds(plugin.proc.pid), time.monotonic(), time.time()
        requests = audit_requests(cluster.audit_log, "bench-plugin", wall0, wall1)
        share = (cpu1 - cpu0) / (t1 - t0) * 100
        print(f"  real plugin (own host, same flavor): start to pool published ({seen} devices;"
              f" {expected} in the hollow nodes' pools) "
              f"{took:.1f}s; at rest over {t1 - t0:.0f}s: CPU {share:.2f} "
              f"% of a core (stat ticks), API requests {requests}, RSS "
              f"{rss_mb(plugin.proc.pid):.0f} MB", flush=True)  # fmt: skip
    finally:
        plugin.stop()


def chosen(args: argparse.Namespace, what: str) -> bool:
    """Whether ``--kinds`` (words of the kinds' names, or ``all``) takes this kind."""
    return args.kinds == "all" or any(k in what.lower() for k in args.kinds.lower().split(","))


def guarded(reading: Callable[..., None], *args: Any) -> None:
    """Run one reading; a failed one is printed, and the size's other figures still come."""
    try:
        reading(*args)
    except Exception as err:  # a figure missing must not lose the run's others
        print(f"  {reading.__name__} failed: {err!r}", flush=True)


def one_size(args: argparse.Namespace, size: int, pools: HostPools) -> None:
    run = Path(tempfile.mkdtemp(prefix=f"scale-{size}-", dir="/tmp"))
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True), audit=True).up()
    beat: LeaseBeat | None = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        apply_deviceclasses(res)
        core.create_namespace({"metadata": {"name": NS}})
        pids = cluster.pids()
        cpu = functools.partial(cpu_seconds, pids["kube-scheduler"])
        t0 = time.monotonic()
        nodes = make_hollow_nodes(api, [f"node-{i:04d}" for i in range(size)])
        beat = LeaseBeat(api, [n["metadata"]["name"] for n in nodes], args.max_beat_writes)
        beat.start()
        while untainted(core) < size and time.monotonic() - t0 < 300:
            time.sleep(1)  # the node lifecycle controller lifts not-ready from Ready nodes
        print(f"== {size} nodes: created in {time.monotonic() - t0:.0f}s, "
              f"{untainted(core)} untainted", flush=True)  # fmt: skip
        names, took = publish_pools(res, pools, nodes, PLAIN_NODE, [])
        print(f"  plain pools: {len(names)} slices published in {took:.0f}s", flush=True)
        while not core.list_namespaced_service_account(NS).items:
            time.sleep(0.2)  # pods need the namespace's default ServiceAccount
        plain, _ = kinds()["whole GPU"]
        if chosen(args, "plain GPU (base)"):
            guarded(kind_round, core, res, "plain GPU (base)", plain, args.pods, "bound", cpu)
        names, took = publish_pools(res, pools, nodes, MIG_NODE, names)
        spec = fabric_spec(args.fabric_gpus, [n["metadata"]["name"] for n in nodes], "node-major")
        fab, fab_s = publish_fabric(res, spec, 1, [])
        print(f"  MIG pools: {len(names)} slices in {took:.0f}s; fabric pool: {len(spec.devices)}"
              f" variants in {len(fab)} slices in {fab_s:.0f}s", flush=True)  # fmt: skip
        time.sleep(2)  # the scheduler's informer takes the new slices in
        guarded(storage_report, api, res, pids, nodes)
        for what, (devices, until) in kinds().items():
            if not chosen(args, what):
                continue
            pods = min(args.pods, args.fabric_gpus) if what == "fabric GPU" else args.pods
            guarded(kind_round, core, res, what, devices, pods, until, cpu)
        expected = len(pools.spec({"metadata": {"name": "x", "uid": "x"}}, MIG_NODE).devices)
        guarded(real_plugin, cluster, api, run, expected, args.rest_seconds)
        guarded(storage_report, api, res, pids, nodes)
        periods = beat.periods[1:] or beat.periods
        print(f"  heartbeat: Lease pass every {max(periods, default=float('nan')):.1f}s at most "
              f"(target {10:.0f}s), {beat.errors} failed renewals, "
              f"{untainted(core)} of {size + 1} nodes untainted", flush=True)  # fmt: skip
        print(f"  logs: {cluster.run_dir / 'logs'}")
    finally:
        if beat is not None:
            beat.stop()
        cluster.down()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="scale_bench")
    parser.add_argument("--sizes", default=os.environ.get("SCALE_SIZES", "100,500"),
                        help="node counts, one control plane each ($SCALE_SIZES)")  # fmt: skip
    parser.add_argument("--pods", type=int, default=50, help="pods per kind and size")
    parser.add_argument("--fabric-gpus", type=int, default=16)
    parser.add_argument("--max-beat-writes", type=float, default=50.0,
                        help="Lease renewals per second at most (all hollow nodes)")  # fmt: skip
    parser.add_argument("--kinds", default="all",
                        help="e.g. 'plain,mig 1g,fabric': kinds whose names hold one")  # fmt: skip
    parser.add_argument("--rest-seconds", type=float, default=30.0)
    parser.add_argument("--bytes-only", action="store_true",
                        help="only the slice byte analysis (no cluster)")  # fmt: skip
    args = parser.parse_args(argv)
    # `timeout` (the flock'd runs) sends SIGTERM: stop the control plane on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pools = HostPools()
    print(byte_report(pools), flush=True)
    if args.bytes_only:
        return
    build_nvml_mock()
    for size in (int(s) for s in args.sizes.split(",")):
        one_size(args, size, pools)


if __name__ == "__main__":
    main(sys.argv[1:])
