"""One real node: namespace holder, containerd, kubelet, kube-proxy, simulated host.

Why this module exists: tests/harness/realnode.py's cluster starts several of these;
each one is a kind node without Docker (see tests/harness/realnode_net.py for the
namespaces, tests/harness/realnode_config.py for the settings and why). This module
starts, restarts and tears down one node's processes and knows which host
path a path inside the node is. Concurrency: plain blocking calls.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.harness import realnode_cgroup as cgroup
from tests.harness import realnode_config as conf
from tests.harness import realnode_net as net
from tests.harness.cluster import PrerequisiteError, bin_dir
from tests.harness.cluster_proc import Component, ComponentError, stop_group

if TYPE_CHECKING:
    from tests.harness.realnode import RealCluster

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = "/var/lib/patchbay-sim"  # a node's own simulated host, inside the node
SIM_HOSTS_DIR = "/var/lib/patchbay-sim-hosts"  # every node's, for the simulated fabric
NVML_MOCK = REPO / "hack" / "nvml-mock" / "build" / "libnvidia-ml.so.1"
# The driver root layout the plugin searches (like NVIDIA's nvidiaDriverRoot).
DRIVER_LIB = "driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
# NVIDIA's tools in the driver root's usr/bin, as the simulated host's stand-ins
# (fabric/simhost). They run in the plugin and MPS supervisor pods, with the
# image's python and its fabric package; the host's bin/ ones name host paths.
IMAGE_PYTHON = "/opt/patchbay/bin/python3"
DRIVER_TOOLS = {
    "nvidia-smi": f"-m fabric.simhost.nvidia_smi --host {SIM_DIR}",
    "nvidia-cuda-mps-control": "-m fabric.simhost.mps_control",
}


@dataclass(frozen=True)
class NodeSpec:
    """One real node: its name, simulated-host topology and extra labels."""

    name: str
    topology: str
    labels: dict[str, str] = field(default_factory=dict)


def make_path(target: str) -> Path:
    """The path a ``make -s <target>`` prints (the cache directories, helm)."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), target],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise PrerequisiteError(f"`make {target}` failed: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def node_binaries() -> tuple[Path, Path]:
    """(kubernetes bin dir, containerd bin dir), complete or PrerequisiteError."""
    k8s, ctrd = bin_dir(), make_path("containerd-bin-dir")
    need = [k8s / b for b in ("kubelet", "kube-proxy", "kubectl")]
    need += [ctrd / b for b in ("containerd", "containerd-shim-runc-v2", "ctr")]
    need += [Path(conf.RUNC), Path(conf.CNI_BIN_DIR) / "bridge", Path("/usr/sbin/iptables")]
    missing = [str(p) for p in need if not os.access(p, os.X_OK)]
    if missing:
        raise PrerequisiteError(
            f"missing: {', '.join(missing)}; run `make k8s-node-bins containerd-bins node-prereqs`"
        )
    return k8s, ctrd


class RealNode:
    """One node: namespace holder, containerd, kubelet, kube-proxy, simulated host."""

    def __init__(self, cluster: RealCluster, spec: NodeSpec, index: int) -> None:
        self.cluster = cluster
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.dir = cluster.run_dir / "nodes" / spec.name
        self.ip = cluster.net.node_ip(index)
        self.cgroup_root = f"/pb{cluster.net.index}-{spec.name}"
        self.holder: int | None = None
        self.components: dict[str, Component] = {}
        self.kubelet_ready_seconds = 0.0  # kubelet start to Node Ready, last start

    # -- paths as the host sees them ------------------------------------------

    def host_path(self, inside: str) -> Path:
        """The host path of a path inside the node (below a private mount)."""
        if inside == "/var/run" or inside.startswith("/var/run/"):  # a link to /run
            inside = inside[len("/var") :]
        for target in net.PRIVATE_MOUNTS:
            if inside == target or inside.startswith(target + "/"):
                rest = inside[len(target) :].lstrip("/")
                return self.dir / "root" / target.strip("/").replace("/", "-") / rest
        if inside.startswith(SIM_DIR):
            return self.sim_dir / inside[len(SIM_DIR) :].lstrip("/")
        return Path(inside)

    @property
    def sim_dir(self) -> Path:
        return self.cluster.sim_hosts / self.name

    @property
    def containerd_sock(self) -> Path:
        return self.host_path(conf.CONTAINERD_SOCK)

    @property
    def cdi_dir(self) -> Path:
        return self.host_path(conf.CDI_DIR)

    def log(self, name: str) -> Path:
        return self.cluster.run_dir / "logs" / f"{self.name}-{name}.log"

    # -- lifecycle -------------------------------------------------------------

    def prepare_host(self) -> None:
        from fabric.simhost.host import SimHost
        from fabric.simhost.topologies import TOPOLOGIES

        host = SimHost.build(TOPOLOGIES[self.spec.topology](), self.sim_dir, name=self.name)
        (host.dir / "dev").mkdir(exist_ok=True)
        lib = host.dir / DRIVER_LIB
        lib.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(NVML_MOCK, lib)
        for tool, args in DRIVER_TOOLS.items():
            path = host.dir / "driver" / "usr" / "bin" / tool
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f'#!/bin/sh\nexec {IMAGE_PYTHON} {args} "$@"\n')
            path.chmod(0o755)
        if host.adapters:  # read by the plugin (fabricAdapters: file:...)
            entries = [f"{name}={bdf_numa[0]}" for name, bdf_numa in sorted(host.adapters.items())]
            (host.dir / "fabric-adapters").write_text("\n".join(entries) + "\n")
        self.files = self.dir / "etc"
        self.files.mkdir(parents=True, exist_ok=True)

    def start(self) -> RealNode:
        self.prepare_host()
        self.holder = net.start_holder(
            self.dir,
            self.log("holder"),
            extra_binds=((self.sim_dir, SIM_DIR), (self.cluster.sim_hosts, SIM_HOSTS_DIR)),
        )
        net.link_node(self.cluster.net, self.holder, self.index)
        cgroup.create(self.cgroup_root)
        self.cluster.save()
        self._write_configs()
        self.start_effects()
        self.start_containerd()
        self.import_images()
        self.start_kubelet()
        self.start_kube_proxy()
        return self

    def _write_configs(self) -> None:
        c = self.cluster
        (self.files / "containerd.toml").write_text(
            conf.containerd_toml(sandbox_image=c.images["pause"])
        )
        cni = self.host_path(conf.CNI_CONF_DIR)
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-patchbay-node.conflist").write_text(
            conf.cni_conflist(c.net.pod_cidr(self.index))
        )
        gates = dict(c.control.gates)  # the control plane's, tier gates included
        (self.files / "kubelet.json").write_text(
            conf.kubelet_config(
                node_ip=self.ip,
                cgroup_root=self.cgroup_root,
                client_ca=str(c.control.pki.ca.cert),
                gates=gates,
            )
        )
        proxy_kubeconfig = c.control.kubeconfig_for("kube-proxy", "system:kube-proxy")
        (self.files / "kube-proxy.json").write_text(
            conf.kube_proxy_config(
                kubeconfig=str(proxy_kubeconfig),
                node_name=self.name,
                cluster_cidr=c.net.cluster_cidr,
                gates={},
            )
        )

    def _spawn(self, name: str, argv: list[str], *, inside: bool = True) -> Component:
        assert self.holder is not None
        full = [*net.nsenter(self.holder), *argv] if inside else argv
        comp = Component(f"{self.name}-{name}", full, self.log(name))
        env_path = f"{self.cluster.ctrd_bins}:/usr/sbin:/usr/bin:/sbin:/bin"
        comp.start(die_with_parent=not self.cluster.detach, env={**os.environ, "PATH": env_path})
        self.components[name] = comp
        self.cluster.save()
        return comp

    def start_effects(self) -> None:
        # The simulated host's "kernel": applies bind/unbind/sriov_numvfs writes.
        self._spawn(
            "effects",
            [sys.executable, "-m", "fabric.simhost", "effects", f"--dir={self.sim_dir}"],
            inside=False,
        )

    def start_containerd(self, timeout: float = 60.0) -> None:
        comp = self._spawn(
            "containerd",
            [
                str(self.cluster.ctrd_bins / "containerd"),
                f"--config={self.files / 'containerd.toml'}",
            ],
        )
        comp.wait_ready(lambda: self.ctr("version", check=False).returncode == 0, timeout)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, namespace k8s.io."""
        argv = [str(self.cluster.ctrd_bins / "ctr"), f"--address={self.containerd_sock}",
                "--namespace=k8s.io", *args]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise ComponentError(f"ctr {' '.join(args)} on {self.name}: {proc.stderr.strip()}")
        return proc

    def import_images(self) -> None:
        """Load the locally built images (nothing can be pulled), like `kind load`."""
        for archive in self.cluster.image_archives.values():
            self.ctr("images", "import", str(archive))

    def start_kubelet(self, timeout: float = 90.0) -> None:
        guard = self.cluster.sysctls
        labels = {"patchbay.dev/real-node": "true", **self.spec.labels}
        comp = self._spawn("kubelet", [
            str(self.cluster.k8s_bins / "kubelet"),
            f"--config={self.files / 'kubelet.json'}",
            f"--kubeconfig={self.cluster.control.node_kubeconfig(self.name)}",
            f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            "--v=2",
        ])  # fmt: skip
        started = time.monotonic()
        try:
            comp.wait_ready(lambda: self.cluster.node_ready(self.name), timeout)
            self.kubelet_ready_seconds = time.monotonic() - started
        finally:
            # The kubelet rewrites host-wide sysctls once per start: put them back.
            deadline = time.monotonic() + 3
            while not guard.changed() and time.monotonic() < deadline:
                time.sleep(0.1)
            guard.restore()

    def start_kube_proxy(self) -> None:
        self._spawn("kube-proxy", [
            str(self.cluster.k8s_bins / "kube-proxy"), f"--config={self.files / 'kube-proxy.json'}",
        ])  # fmt: skip

    def stop_component(self, name: str, *, kill: bool = False) -> bool:
        """Stop one component (SIGKILL if `kill`); False when SIGTERM was ignored."""
        comp = self.components.pop(name, None)
        if comp is None or comp.proc is None:
            return True
        if kill:
            comp.proc.kill()
            termed = True
        else:
            termed = stop_group(comp.proc.pid, comp.name)
        with contextlib.suppress(subprocess.TimeoutExpired):
            comp.proc.wait(timeout=15)
        self.cluster.save()
        return termed

    def restart_kubelet(self) -> None:
        self.stop_component("kubelet")
        self.start_kubelet()

    def check_alive(self) -> None:
        for comp in self.components.values():
            comp.check_alive()

    def stop(self) -> list[str]:
        """Stop the node's components and kill what is left; those that ignored SIGTERM."""
        names = ("kube-proxy", "kubelet", "containerd", "effects")
        killed = [f"{self.name}/{n}" for n in names if not self.stop_component(n)]
        teardown(self.holder, self.cgroup_root)
        self.holder = None
        return killed


def teardown(holder: int | None, cgroup_root: str) -> None:
    """Kill what is left of a node (containers, shims, holder) and remove its cgroups."""
    pids = net.processes_of(holder or 0, cgroup_root) if holder else cgroup.pids_in(cgroup_root)
    net.kill_all(sorted(set(pids) | set(cgroup.pids_in(cgroup_root))))
    cgroup.remove(cgroup_root)
