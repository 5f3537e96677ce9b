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

``--servers-only`` needs no cluster: it measures the plugin's gRPC servers
alone (``plugin.grpc_server``, the plugin's own HTTP/2 server; registration, DRA and health on two
sockets) and, for comparison, ``grpc.aio`` servers with the same sockets and
the registration and DRA services, each in a process of its own and each
``--rounds`` times (median): what grpc-core's threads cost a process at
rest, which no grpcio setting removes (issue 26, docs/figures.md).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import uvloop
from kubernetes import client, config

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.bench import reference
from tests.bench.contenders import cpu_seconds, rss_mb
from tests.bench.rundir import bench_dir
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


def measure(pid: int, seconds: float, label: str = "idle plugin") -> float:
    """Print the window's figures; returns the CPU share (% of a core)."""
    before, ticks0, t0 = threads(pid), cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    after, ticks1, t1 = threads(pid), cpu_seconds(pid), time.monotonic()
    window = t1 - t0
    rows = []
    for tid, (name, run_ns, switches) in after.items():
        _, run0, switches0 = before.get(tid, (name, 0, 0))
        rows.append((name, tid, (run_ns - run0) / 1e6, (switches - switches0) / window))
    cpu_ms = sum(r[2] for r in rows)
    print(f"{label}, {window:.0f} s window: CPU {cpu_ms / window / 10:.4f} % of a core"
          f" ({cpu_ms:.1f} ms run time of its threads; {(ticks1 - ticks0) * 1000:.0f} ms in"
          f" /proc stat ticks), RSS {rss_mb(pid):.1f} MB")  # fmt: skip
    print(f"  {'thread':24s} {'CPU ms':>8s} {'wake-ups/s':>11s}")
    for name, tid, ms, wakes in sorted(rows, key=lambda r: (-r[3], -r[2])):
        print(f"  {name[:16] + f' {tid}':24s} {ms:8.2f} {wakes:11.2f}")
    print(f"  all threads: {sum(r[3] for r in rows):.2f} wake-ups/s")
    return cpu_ms / window / 10


class _NoClaims:
    """A claim handler for servers that no call reaches."""

    async def read(self, claims: Sequence[object]) -> dict[str, object]:
        return {}

    async def prepare(self, claims: Sequence[object], fetched: object = None) -> dict[str, object]:
        return {}

    async def unprepare(self, claims: Sequence[object]) -> dict[str, str]:
        return {}


class _NoHealthChange:
    async def updates(self) -> AsyncIterator[list[object]]:
        await asyncio.Event().wait()  # at rest: never a change
        yield []


async def _serve(kind: str, top: Path) -> None:
    """Child process of ``--servers-only``: serve, say so, wait forever."""
    from plugin.sockets import socket_paths

    paths = socket_paths(top / "reg", top / "plug")
    if kind == "own":
        from plugin.grpc_server import PluginServers

        await PluginServers(paths, _NoClaims(), _NoHealthChange()).start()  # type: ignore[arg-type]
    else:  # grpc.aio, as the plugin served before issue 26
        import grpc

        from plugin.proto import dra_v1_pb2_grpc, dra_v1beta1_pb2_grpc, registration_pb2_grpc
        from plugin.servers.dra import VERSIONS, DraServicer
        from plugin.servers.registration import RegistrationServicer

        dra, reg = grpc.aio.server(), grpc.aio.server()
        for (_, pb2), stubs in zip(VERSIONS, (dra_v1_pb2_grpc, dra_v1beta1_pb2_grpc), strict=True):
            stubs.add_DRAPluginServicer_to_server(DraServicer(_NoClaims(), pb2), dra)  # type: ignore[arg-type]
        servicer = RegistrationServicer("patchbay.dev", paths.dra, ["v1.DRAPlugin"])
        registration_pb2_grpc.add_RegistrationServicer_to_server(servicer, reg)
        for server, path in ((dra, paths.dra), (reg, paths.registration)):
            path.parent.mkdir(parents=True, exist_ok=True)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


def servers_only(seconds: float, settle: float, rounds: int) -> None:
    """Measure each kind of server at rest ``rounds`` times; print medians."""
    shares: dict[str, list[float]] = {"own": [], "grpc.aio": []}
    for _ in range(rounds):
        for kind, runs in shares.items():
            top = tempfile.mkdtemp(prefix="idle-servers-", dir="/tmp")
            cmd = [sys.executable, "-m", "tests.bench.idle_bench", "--serve", kind, "--dir", top]
            child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            try:
                assert child.stdout is not None
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the {kind} servers did not start")
                time.sleep(settle)
                runs.append(measure(child.pid, seconds, f"{kind} servers alone"))
            finally:
                child.kill()
                child.wait()
                shutil.rmtree(top, ignore_errors=True)
    for kind, runs in shares.items():
        spread = f"{min(runs):.4f}-{max(runs):.4f} in {len(runs)} windows of {seconds:.0f} s"
        print(
            f"{kind} servers at rest: median {statistics.median(runs):.4f} % of a core ({spread})"
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="idle_bench")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--settle-seconds", type=float, default=10.0,
                        help="untimed rest after the pool is published")  # fmt: skip
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--py-spy", default=None,
                        help="py-spy binary: dump the threads after the window")  # fmt: skip
    parser.add_argument("--servers-only", action="store_true",
                        help="no cluster: the gRPC servers alone, ours and grpc.aio's")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="windows per kind (--servers-only)")
    parser.add_argument("--serve", choices=("own", "grpc.aio"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:  # the plugin's loop: uvloop's (driver.process)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(args.serve, args.dir))
        return
    if args.servers_only:
        servers_only(args.idle_seconds, args.settle_seconds, args.rounds)
        return
    build_nvml_mock()
    run = bench_dir("idle-")
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
