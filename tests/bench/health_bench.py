"""GPU health figures (issue 38): from the XID to capacity restored, median
and p99, for a local reset and for a fabric replacement.

Setting: the local control plane (kube-controller-manager's device-taint
eviction, the scheduler), simulated nodes with one local H100 and two
fabric adapters (``local-gpu-fabric``: node agent + plugin over the NVML
mock), the simulated fabric behind adapter0 and the controller with
``--spares-replace-failed``. A Deployment of one pod, pinned to its node,
asks for a local GPU, else a warm spare (``firstAvailable``). Timed: the
XID queued on the host -> a new pod of the Deployment Running.

- local: XID 48 (double-bit ECC: the reset class). The pod is evicted, the
  plugin resets the GPU (the simulated ``nvidia-smi --gpu-reset`` keeps it
  off the bus ``--reset-seconds``), checks it, waits ``--settle`` seconds
  without a new XID (``--gpu-health-settle``), checks again and publishes it
  healthy; the replacement pod runs on it. Rounds on one node (the reset
  limit raised for them).
- fabric: XID 64 (row remapping failed: the replace class). The pod is
  evicted, the controller attaches a spare to the node (the fabric's attach
  takes ``--latency`` seconds), and the replacement pod runs on it. A
  replaced GPU stays lost, so each round has a node of its own.

Assumed, not measured: the reset's duration, the settle window and the
attach time (real ones: seconds to tens of seconds each, set by the
hardware, the operator and the fabric manager). Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client, config

from driver.controller.pool.domains import LABEL_PREFIX as REACH_LABEL
from fabric.simhost.nvidia_smi import set_reset_seconds
from tests.bench.fabric_bench import ADAPTERS, bench_clients, p99
from tests.bench.rundir import bench_dir
from tests.harness import cluster as localk8s
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from tests.harness.simnode import PLUGIN_IDENTITY, SimNode, build_nvml_mock

NS = "bench"
LOCAL_CEL = 'device.attributes["patchbay.dev"].attachment == "local"'
SPARE_CEL = (
    '"spare" in device.attributes["patchbay.dev"] && device.attributes["patchbay.dev"].spare'
)
XIDS = {"local": 48, "fabric": 64}  # reset class, replace class


def until(what: str, probe: Callable[[], Any], timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return found


def deployment(apps: client.AppsV1Api, name: str, node: str) -> None:
    labels = {"app": name}
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "m", "image": "pause", "resources": {"claims": [{"name": "c"}]}}],
        "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "gpu"}],
    }
    apps.create_namespaced_deployment(NS, {
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    })  # fmt: skip


def running_pod(core: client.CoreV1Api, app: str, not_: str = "") -> str:
    """The name of the app's pod once one (other than ``not_``) runs; "" before."""
    for p in core.list_namespaced_pod(NS, label_selector=f"app={app}").items:
        live = p.metadata.deletion_timestamp is None and p.status.phase == "Running"
        if live and p.metadata.name != not_:
            return str(p.metadata.name)
    return ""


def no_pods(core: client.CoreV1Api, app: str) -> bool:
    return not core.list_namespaced_pod(NS, label_selector=f"app={app}").items


def local_uuid(res: client.ResourceV1Api, node: str) -> str:
    for s in res.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        for d in s.spec.devices or ():
            a = d.attributes or {}
            if s.spec.pool.name == node and "uuid" in a and a["type"].string == "gpu":
                return str(a["uuid"].string)
    return ""


def healthy(res: client.ResourceV1Api, node: str) -> bool:
    """Whether the node's local GPU is published without a taint."""
    for s in res.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        if s.spec.pool.name == node:
            return all(not d.taints for d in s.spec.devices or ())
    return False


def one_round(
    core: client.CoreV1Api, res: client.ResourceV1Api, node: SimNode, app: str, xid: int
) -> float:
    """XID -> the Deployment's next pod Running, in seconds."""
    first = until(f"{app} running", lambda: running_pod(core, app))
    uuid = until(f"{node.name}'s local GPU", lambda: local_uuid(res, node.name))
    started = time.monotonic()
    node.host.nvml.queue_xid(uuid, xid)
    until(f"{app}'s next pod running", lambda: running_pod(core, app, not_=first))
    return time.monotonic() - started


def node_with_labels(
    cluster: localk8s.LocalCluster, core: client.CoreV1Api, name: str, args: tuple[str, ...]
) -> SimNode:
    plugin_kc = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(cluster, name, "local-gpu-fabric", plugin_kc, (ADAPTERS, *args)).start()

    def labelled() -> bool:  # the reach label provisioning gives it (docs/fabric.md)
        try:
            core.patch_node(name, {"metadata": {"labels": {f"{REACH_LABEL}pcie0.sw0": ""}}})
        except client.ApiException:
            return False
        return True

    until(f"{name} labelled", labelled)
    return node


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="health_bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settle", type=float, default=5.0, help="--gpu-health-settle seconds")
    parser.add_argument("--reset-seconds", type=float, default=1.0, help="a reset's duration")
    parser.add_argument("--latency", type=float, default=2.0, help="fabric attach seconds")
    parser.add_argument("--cases", default="local,fabric", help="of local,fabric")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    if unknown := sorted(set(cases) - set(XIDS)):
        parser.error(f"--cases: unknown {unknown}; known: {sorted(XIDS)}")
    build_nvml_mock()
    run = bench_dir("pbh-")
    cluster = localk8s.LocalCluster(run / "k8s", localk8s.bin_dir(build=True)).up()
    nodes: list[SimNode] = []
    fabric = ctl = None
    try:
        core, res = bench_clients(cluster, NS)
        apps = client.AppsV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        res.create_namespaced_resource_claim_template(NS, {
            "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": sub, "deviceClassName": "gpu.patchbay.dev",
                 "selectors": [{"cel": {"expression": cel}}]}
                for sub, cel in (("local", LOCAL_CEL), ("spare", SPARE_CEL))
            ]}]}}},
        })  # fmt: skip
        health = (f"--gpu-health-settle={args.settle}", f"--gpu-reset-limit={args.rounds + 1}")
        count = 1 + (args.rounds if "fabric" in cases else 0)
        for i in range(count):
            nodes.append(node_with_labels(cluster, core, f"hb-{i}", health))
            set_reset_seconds(nodes[-1].host.dir, args.reset_seconds)
        gpus = [f"gpu-{i}" for i in range(max(args.rounds, 1))]
        sw = switch("sw0", [(n.name, "adapter0", n.host.dir) for n in nodes], gpus)
        fabric = FabricService(run / "fabric", {"id": "pcie0", "type": "PCIe", "switches": [sw]})
        fabric.start(attach_latency=args.latency)
        ctl_kc = cluster.kubeconfig_for(
            "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
        )
        ctl = ControllerProcess(ctl_kc, fabric, run / "controller.log",
                                "--spares-replace-failed=true", "--spares-cap=1")  # fmt: skip
        ctl.start(identity="bench-health")
        print(f"health: settle {args.settle:.1f}s, reset {args.reset_seconds:.1f}s, "
              f"attach {args.latency:.1f}s, {args.rounds} rounds", flush=True)  # fmt: skip
        for name in cases:
            times = []
            for r in range(args.rounds):
                node = nodes[0] if name == "local" else nodes[1 + r]
                app = f"{name}-{r}"
                deployment(apps, app, node.name)
                times.append(one_round(core, res, node, app, XIDS[name]))
                apps.delete_namespaced_deployment(app, NS, propagation_policy="Foreground")
                until(f"{app} gone", partial(no_pods, core, app))
                if name == "local":  # the next round starts from a healthy GPU
                    until("the GPU healthy", partial(healthy, res, node.name))
            print(
                f"health {name:6}: XID -> new pod Running median {statistics.median(times):.2f}s "
                f"p99 {p99(times):.2f}s (n={len(times)})",
                flush=True,
            )
    finally:
        if ctl is not None:
            ctl.stop()
        if fabric is not None:
            fabric.stop()
        for n in nodes:
            n.stop()
        cluster.down()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
