"""Pytest fixtures for a test of one real plugin process: ``node``, a fresh
Node object, and ``plugin``, a started plugin process serving it on its own
simulated 2-GPU host (tests/integration/own_node.py).

Why: the plugin-process tests and the device-metadata process tests run on
the same node and plugin; a module takes them with
``node = plugin_fixtures.node`` (so its tests' arguments do not shadow an
imported name).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from fabric.simhost.topologies import TOPOLOGIES
from tests.e2e.helpers import unique
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.own_node import own_node


@pytest.fixture
def node(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[str]:
    name = unique("int-node")
    core.create_node({"metadata": {"name": name}})
    yield name
    core.delete_node(name)


@pytest.fixture
def plugin(
    local_cluster: LocalCluster, core: client.CoreV1Api, node: str
) -> Iterator[PluginProcess]:
    with own_node(local_cluster, core, "", TOPOLOGIES["2-gpus"](), name=node) as own:
        yield own.plugin().start()
