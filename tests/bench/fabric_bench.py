"""Composable GPU figures: allocation-to-Running latency of a fabric GPU and
the API writes one attach costs.

Setting: the local control plane, one GPU-less simulated node (node agent +
plugin), the simulated fabric with one GPU reachable through the node's
adapter, and the controller. For each fabric latency (0 s and a realistic
value) pods asking for `gpu.patchbay.dev` are created one after another; we
time claim allocated -> pod Running, and count, between the pod's creation
and Running, the writes we can see by watch: claim updates, Node updates
(the plugin's annotation) and ResourceSlice writes. Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cluster as localk8s
import yaml
from fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, apply_rbac, switch
from kubernetes import client, config, watch
from simnode import SimNode, build_nvml_mock

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = "--fabric-adapters=adapter0=0000:15:02.0,adapter1=0000:85:01.0"


class Counter:
    """Counts watch events of one list call in a background thread."""

    def __init__(self, list_fn: Any, **kwargs: Any) -> None:
        self.count = 0
        self._watch = watch.Watch()
        rv = list_fn(**kwargs).metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(list_fn, rv, kwargs), daemon=True)
        self._thread.start()

    def _run(self, list_fn: Any, rv: str, kwargs: dict[str, Any]) -> None:
        for _ in self._watch.stream(list_fn, resource_version=rv, timeout_seconds=600, **kwargs):
            self.count += 1

    def stop(self) -> int:
        self._watch.stop()
        return self.count


def one_pod(core: Any, res: Any, node: str, name: str) -> tuple[float, dict[str, int]]:
    counters = {
        "claim updates": Counter(res.list_namespaced_resource_claim, namespace="bench"),
        "node updates": Counter(core.list_node, field_selector=f"metadata.name={node}"),
        "slice writes": Counter(res.list_resource_slice, field_selector="spec.driver=patchbay.dev"),
    }
    core.create_namespaced_pod("bench", {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "m", "image": "pause",
                                  "resources": {"claims": [{"name": "c"}]}}],
                 "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "gpu"}]},
    })  # fmt: skip
    allocated = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if allocated is None:
            claims = res.list_namespaced_resource_claim("bench").items
            if any(c.status and c.status.allocation for c in claims):
                allocated = time.monotonic()
        if core.read_namespaced_pod(name, "bench").status.phase == "Running":
            break
        time.sleep(0.05)
    latency = time.monotonic() - (allocated or deadline)
    writes = {k: c.stop() for k, c in counters.items()}
    core.delete_namespaced_pod(name, "bench")
    while any(p.metadata.name == name for p in core.list_namespaced_pod("bench").items):
        time.sleep(0.1)
    return latency, writes


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="fabric_bench")
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--latencies", default="0,2")
    args = parser.parse_args(argv)
    build_nvml_mock()
    run = Path(tempfile.mkdtemp(prefix="pbf-", dir="/tmp"))
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    node = fabric = ctl = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        apply_rbac(cluster.kubeconfig, "plugin.yaml")
        apply_rbac(cluster.kubeconfig, "controller.yaml")
        for doc in yaml.safe_load_all(
            (REPO / "deviceclasses" / "gpu.patchbay.dev.yaml").read_text()
        ):
            res.create_device_class(doc)
        core.create_namespace({"metadata": {"name": "bench"}})
        while not core.list_namespaced_service_account("bench").items:
            time.sleep(0.2)  # pods need the namespace's default ServiceAccount
        plugin_kc = cluster.kubeconfig_for(
            "patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",)
        )
        node = SimNode(cluster, "fab-0", "fabric-adapters", plugin_kc, (ADAPTERS,)).start()
        fabric = FabricService(
            run / "fabric",
            {"switches": [switch("sw0", [(node.name, "adapter0", node.host.dir)], ["gpu-0"])]},
        ).start(attach_latency=0.0)
        ctl_kc = cluster.kubeconfig_for(
            "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
        )
        ctl = ControllerProcess(ctl_kc, fabric, run / "controller.log").start()
        res.create_namespaced_resource_claim_template("bench", {
            "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}}},
        })  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            slices = [s for s in res.list_resource_slice().items if s.spec.pool.name == "fabric"]
            if sum(len(s.spec.devices or []) for s in slices) == 1:
                break
            time.sleep(0.2)
        for latency in (float(x) for x in args.latencies.split(",")):
            fabric.faults(attachLatencySeconds=latency, detachLatencySeconds=0)
            times, writes = [], []
            for i in range(args.pods):
                t, w = one_pod(core, res, node.name, f"p-{int(latency * 10)}-{i}")
                times.append(t)
                writes.append(w)
            per = {k: statistics.median(w[k] for w in writes) for k in writes[0]}
            print(
                f"fabric attach latency {latency:.1f}s: allocation->Running median "
                f"{statistics.median(times):.2f}s max {max(times):.2f}s (n={len(times)}); "
                f"beyond the fabric: {statistics.median(times) - latency:.2f}s; writes seen per "
                f"attach: " + ", ".join(f"{k} {v:.0f}" for k, v in per.items())
            )
    finally:
        for proc in (ctl, fabric, node):
            if proc is not None:
                proc.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
