"""A fresh Node with its own simulated host, for a test that runs plugins on it.

Six integration modules needed the same set-up: the NVML C mock built, the
plugin's RBAC applied, a Node object, a temporary directory holding a
:class:`~fabric.simhost.host.SimHost`, and one or more
:class:`simnode.PluginProcess` on that host with the plugin's identity, its
own registry, plugin and CDI directories and a log in the run's log
directory. :func:`own_node` does it once and undoes it all (plugins
stopped, Node deleted, directory removed), as ``tests/e2e/plugin_nodes.py``
does for the e2e tier.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client

from fabric.simhost.host import SimHost
from fabric.simhost.topology import Topology
from tests.e2e.helpers import unique
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PLUGIN_IDENTITY, PluginProcess, apply_plugin_rbac, build_nvml_mock


class OwnNode:
    """A Node's simulated host and the plugins a test runs on it."""

    def __init__(self, local_cluster: LocalCluster, name: str, topology: Topology) -> None:
        self.name = name
        self.base = Path(tempfile.mkdtemp(prefix="pb-", dir="/tmp"))
        self.host = SimHost.build(topology, self.base / "host", name=name)
        self.kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
        self.logs = Path(local_cluster.run_dir) / "logs"
        self.plugins: list[PluginProcess] = []

    def plugin(
        self,
        *extra_args: str,
        log_name: str = "",
        extra_env: Mapping[str, str] | None = None,
    ) -> PluginProcess:
        """A plugin on this host (not started); stopped when the node goes."""
        suffix = f"-{log_name}" if log_name else ""
        proc = PluginProcess(
            self.name,
            self.host,
            self.kubeconfig,
            registry_dir=self.base / "reg",
            plugin_dir=self.base / "plug",
            cdi_root=self.base / "cdi",
            log_path=self.logs / f"plugin-{self.name}{suffix}.log",
            extra_env=extra_env,
            extra_args=extra_args,
        )
        self.plugins.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.plugins:
            proc.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@contextmanager
def own_node(
    local_cluster: LocalCluster,
    core: client.CoreV1Api,
    prefix: str,
    topology: Topology,
    *,
    name: str | None = None,
) -> Iterator[OwnNode]:
    """A new Node ``<prefix>-<random>`` (or the existing ``name``, not deleted)."""
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    node_name = name or unique(prefix)
    if name is None:
        core.create_node({"metadata": {"name": node_name}})
    node = OwnNode(local_cluster, node_name, topology)
    try:
        yield node
    finally:
        node.close()
        if name is None:
            core.delete_node(node_name)
