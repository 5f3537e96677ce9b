"""Hot-plug: a GPU that arrives (or leaves) while the plugin runs is
published (or withdrawn) without a restart, with the root complex of the
adapter it came through."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from driver.errors import HotplugError
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu
from tests.e2e.helpers import unchanged, wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.own_node import own_node

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def gpuless(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[PluginProcess]:
    with own_node(local_cluster, core, "hp-node", TOPOLOGIES["fabric-adapters"]()) as node:
        yield node.plugin().start()


def gpus(resource_api: client.ResourceV1Api, node: str) -> list[client.V1Device]:
    slices = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return [d for s in slices for d in s.spec.devices or [] if d.attributes["type"].string == "gpu"]


def test_hot_added_gpu_is_published_and_removed(
    gpuless: PluginProcess, resource_api: client.ResourceV1Api
) -> None:
    node, host = gpuless.node_name, gpuless.host
    wait_for(
        "empty pool published",
        lambda: resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items,
        timeout=30,
    )
    assert gpus(resource_api, node) == []
    # An empty pool is at rest too: no rewrite loop (the apiserver omits the
    # empty device list, which must still compare equal).
    unchanged(resource_api.list_resource_slice, "the empty pool", 3,
              field_selector=f"spec.nodeName={node}")  # fmt: skip
    bdf = host.free_bdf("adapter1")
    start = time.monotonic()
    host.hot_add("adapter1", Gpu(bdf=bdf))
    (dev,) = wait_for("hot-added GPU published", lambda: gpus(resource_api, node), timeout=30)
    print(f"hot-plug add to slice updated: {time.monotonic() - start:.2f}s")
    assert dev.attributes["resource.kubernetes.io/pciBusID"].string == bdf
    assert dev.attributes["resource.kubernetes.io/pcieRoot"].string == "pci0000:85"
    assert dev.attributes["uuid"].string == host.gpu_uuids()[bdf]
    host.hot_remove(bdf)
    wait_for("removed GPU withdrawn", lambda: gpus(resource_api, node) == [], timeout=30)
    assert gpuless.alive


def test_broken_event_source_takes_the_plugin_down(
    gpuless: PluginProcess, resource_api: client.ResourceV1Api
) -> None:
    # The hot-plug watch is vital (driver/node/hotplug.py): when its source
    # fails the task group fails and the process exits non-zero, for the
    # DaemonSet to restart it, instead of serving on without hot-plug. The
    # exit code is the HotplugError's (driver.errors), with one log line
    # rather than the task group's ExceptionGroup traceback.
    node, host = gpuless.node_name, gpuless.host
    wait_for(
        "pool published",
        lambda: resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items,
        timeout=30,
    )
    feed = Path(host.uevent_path)
    feed.unlink()
    feed.mkdir()  # the next read of the feed fails (IsADirectoryError)
    assert gpuless.wait_exit(timeout=30) == HotplugError.exit_code == 3
    log = gpuless.log_tail(200)
    assert "exiting with status 3: HotplugError: hot-plug event source failed" in log
    assert "Traceback" not in log and "ExceptionGroup" not in log
