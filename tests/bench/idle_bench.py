"""An idle plugin's cost: CPU share and wake-ups per thread over a fixed window.

Why: at rest a node plugin should sleep until something happens (a claim,
a slice deleted, a hot-plug event, a health event); a timer or poll loop
that wakes it costs every node a little, and a thousand nodes a lot.

Setting: the local control plane (real apiserver), one plugin on a simulated
4 x H100 host with the simulated hot-plug feed (``--hotplug-source=feed:``),
as in ``plugin_bench``. Once the pool is published and the plugin has
settled, the bench reads ``/proc/<pid>/task/*/schedstat`` and ``status`` at
the start and end of a window (``--idle-seconds``, default 60): CPU % of one
core for the process, and per thread its run time and voluntary context
switches (a thread that sleeps in a poll loop switches once per wake-up).
Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

from kubernetes import client, config

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.bench import reference
from tests.bench.contenders import cpu_seconds, rss_mb
from tests.harness import cluster as localk8s
from tests.harness.simnode import PluginProcess, build_nvml_mock


def threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (name, CPU time in ns, voluntary context switches).

    CPU time from ``schedstat`` (the scheduler's run time, exact), not the
    ``stat`` ticks (10 ms samples: an idle process's few ticks are noise)."""
    out: dict[int, tuple[str, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run_ns = int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        match = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
        switches = int(match.group(1)) if match else 0
        out[int(task.name)] = (name, run_ns, switches)
    return out


def published(res: client.ResourceV1Api, node: str) -> int:
    items = res.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return sum(len(s.spec.devices or []) for s in items)


def measure(pid: int, seconds: float) -> None:
    before, ticks0, t0 = threads(pid), cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    after, ticks1, t1 = threads(pid), cpu_seconds(pid), time.monotonic()
    window = t1 - t0
    rows = []
    for tid, (name, run_ns, switches) in after.items():
        _, run0, switches0 = before.get(tid, (name, 0, 0))
        rows.append((name, tid, (run_ns - run0) / 1e6, (switches - switches0) / window))
    cpu_ms = sum(r[2] for r in rows)
    print(f"idle plugin, {window:.0f} s window: CPU {cpu_ms / window / 10:.4f} % of a core"
          f" ({cpu_ms:.1f} ms run time of its threads; {(ticks1 - ticks0) * 1000:.0f} ms in"
          f" /proc stat ticks), RSS {rss_mb(pid):.1f} MB")  # fmt: skip
    print(f"  {'thread':24s} {'CPU ms':>8s} {'wake-ups/s':>11s}")
    for name, tid, ms, wakes in sorted(rows, key=lambda r: (-r[3], -r[2])):
        print(f"  {name[:16] + f' {tid}':24s} {ms:8.2f} {wakes:11.2f}")
    print(f"  all threads: {sum(r[3] for r in rows):.2f} wake-ups/s")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="idle_bench")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--settle-seconds", type=float, default=10.0,
                        help="untimed rest after the pool is published")  # fmt: skip
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--py-spy", default=None,
                        help="py-spy binary: dump the threads after the window")  # fmt: skip
    args = parser.parse_args(argv)
    build_nvml_mock()
    run = Path(tempfile.mkdtemp(prefix="idle-", dir="/tmp"))
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    plugin: PluginProcess | None = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        reference.apply_bench_rbac(api)
        kubeconfig = cluster.kubeconfig_for("bench-plugin", "bench-plugin", (reference.GROUP,))
        core.create_node({"metadata": {"name": "idle"}})
        host = SimHost.build(TOPOLOGIES["4x-h100"](), run / "host", name="idle")
        plugin = PluginProcess(
            "idle", host, kubeconfig, registry_dir=run / "reg", plugin_dir=run / "plug",
            cdi_root=run / "cdi", log_path=run / "plugin.log",
            extra_args=(f"--log-level={args.log_level}",),
        ).start()  # fmt: skip
        assert plugin.proc is not None
        deadline = time.monotonic() + 120
        while not published(res, "idle"):
            if time.monotonic() > deadline or not plugin.alive:
                raise RuntimeError(f"the plugin published no pool:\n{plugin.log_tail()}")
            time.sleep(0.5)
        time.sleep(args.settle_seconds)
        measure(plugin.proc.pid, args.idle_seconds)
        if args.py_spy:  # which Python thread each thread id is
            dump = [args.py_spy, "dump", "--pid", str(plugin.proc.pid)]
            print(subprocess.run(dump, capture_output=True, text=True, check=False).stdout)
    finally:
        if plugin is not None:
            plugin.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
