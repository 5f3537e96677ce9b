"""Simulated nodes: a simulated host, the node agent and our plugin process.

Why this module exists: the demo and the cluster e2e tests need "nodes"
that behave like real ones end to end. A :class:`SimNode` combines a
simulated host (``fabric.simhost``: sysfs tree, NVML mock state, hot-plug
feed), a node agent (the kubelet's DRA manager, ``tests/harness/cluster_agent.py``)
and a real ``patchbay-plugin`` process that reads NVML through pynvml and
our C mock. :class:`PluginProcess` is usable on its own (integration tests
play the kubelet themselves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fabric.simhost.effects import EffectsWatcher
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.harness.cluster_agent import ClusterLike, NodeAgent
from tests.harness.cluster_proc import pid_alive, stop_group, tail

if TYPE_CHECKING:
    from kubernetes import client

REPO = Path(__file__).resolve().parents[2]
NVML_MOCK_LIB = REPO / "hack" / "nvml-mock" / "build" / "libnvidia-ml.so.1"
PLUGIN_GROUP = "patchbay:plugins"
# The plugin's kubeconfig name, certificate CN and O: the identity
# hack/rbac/plugin.yaml binds (``LocalCluster.kubeconfig_for(*PLUGIN_IDENTITY)``).
PLUGIN_IDENTITY = ("patchbay-plugin", "patchbay-plugin", (PLUGIN_GROUP,))


def build_nvml_mock() -> Path:
    """Build the NVML mock library if needed; its absolute path."""
    subprocess.run(["make", "-s", "-C", str(REPO), "nvml-mock"], check=True)
    return NVML_MOCK_LIB


def apply_rbac(kubeconfig: Path, manifest: str) -> None:
    """Create the (Cluster)Role/Binding documents of ``hack/rbac/<manifest>`` (idempotent)."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    api = config.new_client_from_config(config_file=str(kubeconfig))
    rbac = client.RbacAuthorizationV1Api(api)
    creates = {
        "ClusterRole": rbac.create_cluster_role,
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda d: rbac.create_namespaced_role(d["metadata"]["namespace"], d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(d["metadata"]["namespace"], d),
    }
    for doc in yaml.safe_load_all((REPO / "hack" / "rbac" / manifest).read_text()):
        try:
            creates[doc["kind"]](doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
    api.close()


def apply_deviceclasses(resource_api: client.ResourceV1Api) -> None:
    """Create every DeviceClass of ``deviceclasses/`` (the single source; idempotent)."""
    from kubernetes.client.rest import ApiException

    for path in sorted((REPO / "deviceclasses").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DeviceClass":
                try:
                    resource_api.create_device_class(doc)
                except ApiException as exc:
                    if exc.status != 409:
                        raise


def apply_plugin_rbac(kubeconfig: Path) -> None:
    """Install the plugin's ClusterRole and binding (idempotent)."""
    apply_rbac(kubeconfig, "plugin.yaml")


class PluginProcess:
    """One ``patchbay-plugin`` process serving a simulated host."""

    def __init__(
        self,
        node_name: str,
        host: SimHost,
        kubeconfig: Path,
        *,
        registry_dir: Path,
        plugin_dir: Path,
        cdi_root: Path,
        log_path: Path,
        extra_env: Mapping[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.node_name = node_name
        self.host = host
        self.kubeconfig = kubeconfig
        self.registry_dir = registry_dir
        self.plugin_dir = plugin_dir
        self.cdi_root = cdi_root
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        # Applies the plugin's sysfs writes (bind/unbind, sriov_numvfs) to the
        # simulated tree, as the kernel would; outlives a killed plugin.
        self.effects: EffectsWatcher | None = None
        self.boot_id_file = host.dir / "boot_id"
        if not self.boot_id_file.exists():
            self.boot_id_file.write_text("00000000-0000-4000-8000-000000000001\n")

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "plugin.main",
            f"--node-name={self.node_name}",
            f"--kubeconfig={self.kubeconfig}",
            f"--registry-dir={self.registry_dir}",
            f"--plugin-dir={self.plugin_dir}",
            f"--cdi-root={self.cdi_root}",
            f"--sysfs-root={self.host.sysfs_root}",
            f"--dev-root={self.host.dir / 'dev'}",
            f"--boot-id-file={self.boot_id_file}",
            f"--hotplug-source=feed:{self.host.uevent_path}",
            "--log-level=debug",
            *self.host.tool_args(),
            *self.extra_args,
        ]

    def env(self, **overrides: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.host.env())
        env["PATCHBAY_NVML_LIBRARY"] = str(NVML_MOCK_LIB)
        env["PYTHONPATH"] = str(REPO)
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def start(self, **env_overrides: str) -> PluginProcess:
        for d in (self.registry_dir, self.plugin_dir, self.cdi_root, self.log_path.parent):
            d.mkdir(parents=True, exist_ok=True)
        if self.effects is None:
            self.effects = self.host.effects_watcher().start()
        with self.log_path.open("ab") as out:
            out.write(f"--- start: {' '.join(self.argv())}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv(),
                env=self.env(**env_overrides),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, like a crash."""
        if self.alive and self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM and wait (graceful shutdown)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            stop_group(self.proc.pid, f"plugin-{self.node_name}")
            self.proc.wait(timeout=15)
        self.proc = None
        if self.effects is not None:
            self.effects.stop()
            self.effects = None

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


class SimNode:
    """A simulated node in a local cluster: host + node agent + plugin."""

    def __init__(
        self,
        cluster: ClusterLike,
        name: str,
        topology: str,
        plugin_kubeconfig: Path,
        plugin_args: tuple[str, ...] = (),
    ) -> None:
        self.cluster = cluster
        self.name = name
        root = Path(cluster.run_dir) / "nodes" / name
        self.host = SimHost.build(TOPOLOGIES[topology](), root / "host", name=name)
        self.agent = NodeAgent(cluster, name, root)
        self.plugin = PluginProcess(
            name,
            self.host,
            plugin_kubeconfig,
            registry_dir=self.agent.registry_dir,
            plugin_dir=self.agent.plugins_dir / "patchbay.dev",
            cdi_root=self.agent.cdi_root,
            log_path=Path(cluster.run_dir) / "logs" / f"plugin-{name}.log",
            extra_args=plugin_args,
        )

    def start(self) -> SimNode:
        self.agent.start()
        self.plugin.start()
        return self

    def stop(self) -> None:
        self.plugin.stop()
        self.agent.stop()

    def check_alive(self) -> None:
        self.agent.check_alive()
        if not self.plugin.alive:
            raise RuntimeError(f"plugin on {self.name} exited:\n{self.plugin.log_tail()}")


__all__ = [
    "PluginProcess",
    "SimNode",
    "apply_deviceclasses",
    "apply_plugin_rbac",
    "apply_rbac",
    "build_nvml_mock",
    "pid_alive",
]
