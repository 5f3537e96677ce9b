"""Real nodes: kubelet + containerd + runc + kube-proxy, each node in its own namespaces.

Why this module exists: the node-agent tier (tests/harness/cluster_agent.py) embeds
only the kubelet's DRA manager; no container ever starts. Users install
patchbay with Helm on clusters whose kubelet calls the plugin and whose
runtime injects our CDI devices, so this launcher runs exactly that without
Docker: each node is like a kind node in its container (network and mount
namespaces of its own, tests/harness/realnode_net.py), with its own containerd
(config in tests/harness/realnode_config.py), kubelet (own ``cgroupRoot``,
tests/harness/realnode_cgroup.py), kube-proxy, and a simulated host (sysfs tree,
NVML mock, hot-plug feed) at ``/var/lib/patchbay-sim`` where the chart's
hostPaths point. The control plane is tests/harness/cluster.py's, listening on the
bridge address the nodes reach.

Python API: ``RealCluster(run_dir, nodes).up()`` / ``.down()``, each
``RealNode`` with ``.restart_kubelet()``, ``.ctr(...)``, ``.host``.
CLI: ``python hack/realnode.py up|down|status [--dir DIR]``.
Concurrency: plain blocking calls; the components are separate processes.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.harness import realnode_chart
from tests.harness import realnode_net as net
from tests.harness.cluster import LocalCluster, PrerequisiteError, bin_dir
from tests.harness.cluster_proc import ComponentError, stop_group, tail
from tests.harness.realnode_node import NodeSpec, RealNode, node_binaries, teardown

__all__ = [
    "DEFAULT_NODES", "ComponentError", "NodeSpec", "PrerequisiteError", "RealCluster",
    "RealNode", "net",
]  # fmt: skip

log = logging.getLogger(__name__)

# The taint TaintNodesByCondition puts on a new Node until it is seen Ready.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


class RealCluster:
    """The control plane on the node bridge plus real nodes."""

    def __init__(
        self,
        run_dir: Path | str,
        nodes: list[NodeSpec] | None = None,
        *,
        net_index: int = 0,
        gates: Mapping[str, bool] | None = None,
        runtime_config: Sequence[str] = (),
    ) -> None:
        """``gates``, ``runtime_config``: :class:`LocalCluster`'s, on the
        kubelets too (tests/gated); other tiers leave them out."""
        self.run_dir = Path(run_dir).resolve()
        self.net = net.Network(net_index)
        self.control = LocalCluster(
            self.run_dir / "k8s", address=self.net.host_ip, gates=gates,
            runtime_config=runtime_config,
        )  # fmt: skip
        self.sim_hosts = self.run_dir / "sim-hosts"
        self.specs = list(nodes or [])
        self.nodes: dict[str, RealNode] = {}
        self.detach = False
        self.k8s_bins = self.ctrd_bins = Path()
        self.images: dict[str, str] = {}
        self.image_archives: dict[str, Path] = {}
        self._state = self.run_dir / "realnodes.json"
        self.ready_seconds: dict[str, float] = {}  # node start (namespaces) to Ready
        self.sysctls = net.SysctlGuard()

    @property
    def kubeconfig(self) -> Path:
        return self.control.kubeconfig

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.k8s_bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise ComponentError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def node_ready(self, name: str) -> bool:
        """Ready, and no longer tainted not-ready. The apiserver taints a new
        Node ``node.kubernetes.io/not-ready:NoSchedule`` (TaintNodesByCondition)
        until the node lifecycle controller sees it Ready, and until then the
        DaemonSet controller counts the node out: a chart installed meanwhile
        looked rolled out to helm's --wait (desired 0) with no plugin pod yet
        (a clean-clone run, the controller-manager's controllers starting a
        second after the kubelet reported Ready)."""
        out = self.kubectl("get", "node", name, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        node = json.loads(out.stdout)
        conds = node.get("status", {}).get("conditions", [])
        taints = node.get("spec", {}).get("taints") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not any(
            t.get("key") == NOT_READY_TAINT for t in taints
        )

    def up(self, *, detach: bool = False) -> RealCluster:
        from tests.harness import images  # the pause, busybox and patchbay archives

        self.detach = detach
        self.k8s_bins, self.ctrd_bins = node_binaries()
        if self._state.exists():
            self.down()
        # A fresh start: a previous run's etcd data and simulated hosts would clash.
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        built = images.build_all()
        self.image_archives = dict(built)
        self.images = {
            "pause": images.PAUSE_IMAGE,
            "busybox": images.BUSYBOX_IMAGE,
            "patchbay": images.PATCHBAY_IMAGE,
        }
        start = time.monotonic()
        try:
            net.create_bridge(self.net)
            self.save()
            self.control.up(detach=detach)
            for i, spec in enumerate(self.specs):
                node = RealNode(self, spec, i)
                self.nodes[spec.name] = node
                t0 = time.monotonic()
                node.start()
                self.ready_seconds[spec.name] = time.monotonic() - t0
                log.info("node %s Ready in %.1fs", spec.name, self.ready_seconds[spec.name])
            for node in self.nodes.values():  # pod-to-pod traffic across nodes
                assert node.holder is not None
                others = [n.index for n in self.nodes.values() if n is not node]
                net.route_pods(self.net, node.holder, others)
        except BaseException:
            self.down()
            raise
        self.startup_seconds = time.monotonic() - start
        return self

    def save(self) -> None:
        state = {
            "net_index": self.net.index,
            "sysctls": self.sysctls.saved,
            "nodes": {
                n.name: {
                    "holder": n.holder,
                    "cgroup_root": n.cgroup_root,
                    "pids": {k: c.pid for k, c in n.components.items() if c.pid},
                }
                for n in self.nodes.values()
            },
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._state.write_text(json.dumps(state, indent=1) + "\n")

    def down(self) -> list[str]:
        """Stop every node, the control plane and the bridge; restore sysctls.
        The components that ignored SIGTERM and had to be killed are returned."""
        state = json.loads(self._state.read_text()) if self._state.exists() else {}
        killed = [name for node in list(self.nodes.values()) for name in node.stop()]
        for node_name, info in state.get("nodes", {}).items():
            for name, pid in info.get("pids", {}).items():
                if not stop_group(pid, name):
                    killed.append(f"{node_name}/{name}")
            teardown(info.get("holder"), info["cgroup_root"])
        self.nodes.clear()
        killed += self.control.down()
        net.delete_bridge(net.Network(state.get("net_index", self.net.index)))
        if state.get("sysctls"):
            self.sysctls.saved = state["sysctls"]
        self.sysctls.restore()
        self._state.unlink(missing_ok=True)
        return killed

    def log_tails(self, lines: int = 25) -> str:
        logs = sorted((self.run_dir / "logs").glob("*.log"))
        return "\n".join(f"== {p.name}\n{tail(p, lines)}" for p in logs)


DEFAULT_NODES = [
    NodeSpec("node-a", "2x-h100-nic", {"patchbay.dev/simulated": "true"}),
    # node-c's fabric reach labels, set as provisioning would (kubelet --node-labels).
    NodeSpec(
        "node-c",
        "fabric-adapters",
        {"patchbay.dev/simulated": "true", **realnode_chart.reach_labels()},
    ),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", default="/tmp/patchbay-nodes", help="run directory (short)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cluster = RealCluster(args.dir, DEFAULT_NODES)
    if args.command == "up":
        try:
            cluster.up(detach=True)
        except (ComponentError, PrerequisiteError, net.NetError) as err:
            print(f"real nodes up failed: {err}", file=sys.stderr)
            return 1
        print(f"ready in {cluster.startup_seconds:.1f}s: export KUBECONFIG={cluster.kubeconfig}")
        print(f"kubectl: {cluster.k8s_bins / 'kubectl'}")
    elif args.command == "down":
        cluster.down()
        print("stopped")
    else:
        cluster.k8s_bins = bin_dir()
        print(cluster.kubectl("get", "nodes", "-o", "wide", check=False).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
