"""Node plugin figures: prepare/unprepare latency over the real socket,
slice writes per minute at rest, and the plugin's resident memory.

Setting: the local control plane (real apiserver), one plugin process on a
simulated 4-GPU host with NVML through pynvml and the C mock; this script
plays the kubelet. Each iteration prepares one single-GPU claim and
unprepares it again. Figures only: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import cluster as localk8s
import grpc
from cluster_proc import free_port
from kubernetes import client, config
from simnode import PluginProcess, apply_plugin_rbac, build_nvml_mock

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc, registration_pb2, registration_pb2_grpc
from tests.kube.claims import allocated_claim


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) / 1024 if match else float("nan")


def writes_total(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("patchbay_resourceslice_writes_total")
    )


def wait_plugin(proc: PluginProcess) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for sock in proc.registry_dir.glob("*.sock"):
            try:
                with grpc.insecure_channel(f"unix://{sock}") as ch:
                    info = registration_pb2_grpc.RegistrationStub(ch).GetInfo(
                        registration_pb2.InfoRequest(), timeout=1
                    )
                    return str(info.endpoint)
            except grpc.RpcError:
                pass
        time.sleep(0.2)
    raise RuntimeError(f"plugin did not come up:\n{proc.log_tail()}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--idle-seconds", type=int, default=60)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)

    build_nvml_mock()
    run = Path(tempfile.mkdtemp(prefix="pbb-", dir="/tmp"))
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    proc = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        core.create_node({"metadata": {"name": "bench"}})
        core.create_namespace({"metadata": {"name": "bench"}})
        apply_plugin_rbac(cluster.kubeconfig)
        kubeconfig = cluster.kubeconfig_for("plugin", "patchbay-plugin", ("patchbay:plugins",))
        host = SimHost.build(TOPOLOGIES["4x-h100"](), run / "host", name="bench")
        port = free_port()
        proc = PluginProcess(
            "bench",
            host,
            kubeconfig,
            registry_dir=run / "reg",
            plugin_dir=run / "plug",
            cdi_root=run / "cdi",
            log_path=run / "plugin.log",
            extra_args=(f"--metrics-port={port}", f"--log-level={args.log_level}"),
        ).start()
        endpoint = wait_plugin(proc)
        claims = [
            allocated_claim(res, "bench", f"c{i}", "bench", ["gpu-0"])
            for i in range(args.iterations)
        ]
        prep, unprep = [], []
        with grpc.insecure_channel(f"unix://{endpoint}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            for i, uid in enumerate(claims):
                claim = [dra_v1_pb2.Claim(namespace="bench", name=f"c{i}", uid=uid)]
                t0 = time.perf_counter()
                out = stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=claim)
                )
                t1 = time.perf_counter()
                assert out.claims[uid].error == "", out.claims[uid].error
                stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claim))
                t2 = time.perf_counter()
                prep.append((t1 - t0) * 1000)
                unprep.append((t2 - t1) * 1000)
        print(
            f"NodePrepareResources   n={len(prep)} median {statistics.median(prep):.2f} ms"
            f"  p99 {percentile(prep, 0.99):.2f} ms"
        )
        print(
            f"NodeUnprepareResources n={len(unprep)} median {statistics.median(unprep):.2f} ms"
            f"  p99 {percentile(unprep, 0.99):.2f} ms"
        )
        before = writes_total(port)
        time.sleep(args.idle_seconds)
        after = writes_total(port)
        per_min = (after - before) * 60 / args.idle_seconds
        print(
            f"slice writes at rest: {after - before:.0f} in {args.idle_seconds}s"
            f" ({per_min:.1f} per minute; {before:.0f} writes since start)"
        )
        print(f"plugin RSS: {rss_mb(proc.proc.pid):.1f} MB")  # type: ignore[union-attr]
    finally:
        if proc is not None:
            proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
