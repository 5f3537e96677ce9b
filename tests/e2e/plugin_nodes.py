"""One simulated node running our plugin, for an e2e module of its own.

Why this module exists: the MIG, GPU-sharing and Kueue modules each need a
node whose plugin runs with their arguments, and wait until its devices are
published before any test starts; one helper keeps that set-up (the NVML
mock, the plugin's RBAC and identity, our DeviceClasses) and its teardown in
one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kubernetes import client

from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)


def node_slices(resource_api: client.ResourceV1Api, node: str) -> list[Any]:
    return list(resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items)


def node_devices(resource_api: client.ResourceV1Api, node: str) -> list[Any]:
    return [d for s in node_slices(resource_api, node) for d in (s.spec.devices or [])]


def published_devices(resource_api: client.ResourceV1Api, node: str) -> int:
    items = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return sum(len(s.spec.devices or []) for s in items)


@contextlib.contextmanager
def plugin_node(
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    prefix: str,
    topology: str,
    *,
    args: Sequence[str] = (),
    ready: Callable[[int], bool] = lambda n: n > 0,
    what: str = "devices published",
    after_stop: Callable[[SimNode], None] | None = None,
) -> Iterator[SimNode]:
    """A started node ``<prefix>-<hex>`` with the simulated host ``topology``,
    yielded once ``ready`` accepts the number of devices its slices publish;
    stopped (then ``after_stop``) and its Node deleted afterwards."""
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(local_cluster, unique(prefix), topology, kubeconfig)
    if args:
        node.plugin.extra_args = tuple(args)
    node.start()
    try:

        def published() -> bool:
            node.check_alive()
            return ready(published_devices(resource_api, node.name))

        wait_for(what, published, timeout=90)
        yield node
    finally:
        node.stop()
        if after_stop is not None:
            after_stop(node)
        delete_quietly(core.delete_node, node.name)
