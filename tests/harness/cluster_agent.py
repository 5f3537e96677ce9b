"""Start and stop a node agent (hack/k8s/cmd/node-agent) next to a local cluster.

Why this module exists: the e2e tests and the demo need "nodes" that do the
kubelet's DRA work (plugin registration, prepare/unprepare, pod status). The
node agent binary does that; this helper gives it an identity, directories
short enough for Unix sockets, a log file in the cluster's run directory and
a clean stop.

Identity: the agent runs as the node itself (CN=system:node:<name>,
O=system:nodes), exactly like a kubelet, so the apiserver's Node authorizer
and NodeRestriction admission decide what it may do (its own Node and Lease,
pods bound to it, the claims those pods use, and delete-collection of its
node's ResourceSlices). No extra RBAC is granted.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

from tests.harness.cluster_proc import Component, ComponentError, stop_group

log = logging.getLogger(__name__)

SOCKET_PATH_LIMIT = 107  # sun_path is 108 bytes including the NUL


class ClusterLike(Protocol):
    run_dir: Path
    binaries: Path | None

    def node_kubeconfig(self, node_name: str) -> Path: ...


class NodeAgent:
    """One node agent process: `NodeAgent(cluster, "node-a").start()` ... `.stop()`."""

    def __init__(
        self,
        cluster: ClusterLike,
        node_name: str,
        root_dir: Path | None = None,
        *,
        state_dir: Path | None = None,
        cdi_root: Path | None = None,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
        labels: dict[str, str] | None = None,
        binary: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.node_name = node_name
        self.root_dir = (root_dir or cluster.run_dir / "nodes" / node_name).resolve()
        self.state_dir = (state_dir or self.root_dir / "agent").resolve()
        self.cdi_root = (cdi_root or self.root_dir / "cdi").resolve()
        self.capacity = {"cpu": cpu, "memory": memory, "pods": pods}
        self.labels = dict(labels or {})
        if binary is None:
            if cluster.binaries is None:
                raise ValueError("the cluster has no binary directory; pass binary=")
            binary = cluster.binaries / "node-agent"
        self.binary = binary
        self.component: Component | None = None
        # Rolling-update socket names carry the pod UID: patchbay.dev-<uid>-reg.sock.
        longest = self.root_dir / "plugins_registry" / ("patchbay.dev-" + "u" * 36 + "-reg.sock")
        if len(str(longest)) > SOCKET_PATH_LIMIT:
            log.warning(
                "root dir %s leaves no room for pod-UID socket names (%d > %d bytes); "
                "plain names like patchbay.dev-reg.sock still fit",
                self.root_dir,
                len(str(longest)),
                SOCKET_PATH_LIMIT,
            )

    @property
    def registry_dir(self) -> Path:
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root_dir / "plugins"

    @property
    def log_path(self) -> Path:
        return self.cluster.run_dir / "logs" / f"node-agent-{self.node_name}.log"

    def pod_record(self, namespace: str, name: str) -> dict[str, object] | None:
        """The agent's JSON record of a running pod (CDI devices per container), if any."""
        path = self.state_dir / "pods" / f"{namespace}_{name}.json"
        try:
            data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return data

    def argv(self) -> list[str]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return [
            str(self.binary),
            f"--kubeconfig={self.cluster.node_kubeconfig(self.node_name)}",
            f"--node-name={self.node_name}",
            f"--root-dir={self.root_dir}",
            f"--state-dir={self.state_dir}",
            f"--cdi-root={self.cdi_root}",
            f"--cpu={self.capacity['cpu']}",
            f"--memory={self.capacity['memory']}",
            f"--pods={self.capacity['pods']}",
            f"--node-labels={labels}",
            "--v=2",
        ]

    def start(self, *, die_with_parent: bool = True) -> NodeAgent:
        if not self.binary.exists():
            raise ComponentError(f"{self.binary} is missing; run `make k8s-bins`")
        for d in (self.registry_dir, self.plugins_dir, self.state_dir, self.cdi_root):
            d.mkdir(parents=True, exist_ok=True)
        self.component = Component(f"node-agent-{self.node_name}", self.argv(), self.log_path)
        self.component.start(die_with_parent=die_with_parent)
        return self

    def check_alive(self) -> None:
        if self.component is not None:
            self.component.check_alive()

    def stop(self) -> None:
        comp, self.component = self.component, None
        if comp is None or comp.proc is None:
            return
        stop_group(comp.proc.pid, comp.name)
        comp.proc.wait(timeout=10)

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
