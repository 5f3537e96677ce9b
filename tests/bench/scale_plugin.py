"""A real plugin process against the scale bench's loaded control plane.

Why a module: beside the hollow nodes' pools (built in-process,
``scale_pool``), the scale bench starts one real ``patchbay-plugin`` on a
simulated host of its own, same flavor, against the loaded control plane,
and reads its time from start to its pool published and its CPU and API
requests at rest (the apiserver's audit log): what a node's plugin costs
when the cluster is large.
"""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.bench import reference
from tests.bench.scale_cluster import rss_mb, served_slices
from tests.bench.scale_pool import MIG_NODE, plugin_args
from tests.bench.sched_bench import cpu_seconds
from tests.e2e.helpers import make_node
from tests.harness import cluster as localk8s
from tests.harness.simnode import PluginProcess

Obj = dict[str, Any]


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
