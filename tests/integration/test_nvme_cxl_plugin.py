"""NVMe drives and CXL memory through the real plugin process: local drives published
beside the GPUs of their root complex, fabric-attached drives and CXL memory kept
out of the node's pool and reported in the Node annotation, and a claim of both
prepared over the kubelet's socket into a CDI spec with their device nodes, then
unprepared (this test plays the kubelet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from driver.fabric_devices.naming import FABRIC_POOL, NodeFabric, cxl_key, variant_name
from fabric.simhost.devnodes import NVME_BLOCK_MAJOR
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import CxlMemory, Nvme
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.kubelet import wait_registered
from tests.integration.own_node import own_node
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

ADAPTERS = "adapter0=0000:15:02.0,adapter1=0000:85:02.0"
CXL_SERIAL = 0x4C1D96FFFEDDD835


@pytest.fixture
def plugin(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[PluginProcess]:
    topology = TOPOLOGIES["gpu-nvme"]()
    with own_node(local_cluster, core, "nv-node", topology) as node:
        yield node.plugin("--nvme-drives=all", f"--fabric-adapters={ADAPTERS}").start()


def published(api: client.ResourceV1Api, node: str, kind: str) -> list[Any]:
    slices = api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return [d for s in slices for d in s.spec.devices or [] if d.attributes["type"].string == kind]


def report(core: client.CoreV1Api, node: str) -> NodeFabric | None:
    return NodeFabric.from_node(core.api_client.sanitize_for_serialization(core.read_node(node)))


def test_drives_and_cxl_memory_end_to_end_on_the_node(
    plugin: PluginProcess,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    node, host = plugin.node_name, plugin.host
    kubelet = wait_registered(plugin)
    drives = wait_for(
        "local drives published", lambda: published(resource_api, node, "nvme"), timeout=30
    )
    roots = {d.attributes["resource.kubernetes.io/pcieRoot"].string for d in drives}
    gpu_roots = {
        d.attributes["resource.kubernetes.io/pcieRoot"].string
        for d in published(resource_api, node, "gpu")
    }
    assert roots == gpu_roots == {"pci0000:15", "pci0000:85"}
    assert {d.capacity["capacity"].value for d in drives} == {"3750738264Ki"}

    nvme_bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Nvme(nvme_bdf, serial="FAB001"))
    cxl_bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", CxlMemory(cxl_bdf, CXL_SERIAL, 64 << 30))
    cxl_id = f"{CXL_SERIAL:#x}"
    cxl_memdev = cxl_key(cxl_id, cxl_bdf)  # the node's key: an MLD's LDs share the serial

    def attached() -> bool:
        seen = report(core, node)
        return seen is not None and seen.nvme == {"FAB001": "adapter0"} and bool(seen.cxlmem)

    wait_for("attached devices in the Node report", attached, timeout=30)
    seen = report(core, node)
    assert seen is not None and seen.cxlmem == {cxl_memdev: "adapter1"}
    # Never offered as free local devices.
    assert {d.attributes["resource.kubernetes.io/pciBusID"].string for d in drives} == {
        d.attributes["resource.kubernetes.io/pciBusID"].string
        for d in published(resource_api, node, "nvme")
    }
    assert published(resource_api, node, "cxlmem") == []

    # The CXL memory by the name from its serial, as allocated before the node
    # keyed it by memdev (issue 35): alone with its serial, it still answers to it.
    names = [
        variant_name("FAB001", node, "adapter0", "nvme"),
        variant_name(cxl_id, node, "adapter1", "cxlmem"),
    ]
    uid = allocated_claim(resource_api, namespace, "tier", node, names, pool=FABRIC_POOL)
    endpoint = kubelet.get_info().endpoint
    claim = [(namespace, "tier", uid)]
    result = kubelet.prepare(endpoint, claim)[uid]
    assert result.error == "", result.error
    spec = json.loads((plugin.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").read_text())
    edits = [d["containerEdits"] for d in spec["devices"]]  # the metadata mounts have no nodes
    nodes = {n["path"]: n for e in edits for n in e.get("deviceNodes", [])}
    assert sorted(nodes) == ["/dev/dax0.0", "/dev/ng2n1", "/dev/nvme2n1"]
    assert (nodes["/dev/nvme2n1"]["type"], nodes["/dev/nvme2n1"]["major"]) == (
        "b",
        NVME_BLOCK_MAJOR,
    )
    env = set(spec["containerEdits"]["env"])
    assert {"PATCHBAY_NVME_DEVICES=/dev/nvme2n1", "PATCHBAY_CXL_DEVICES=/dev/dax0.0"} <= env
    assert f"PATCHBAY_CXL_SIZE_0={64 << 30}" in env

    def busy(want: set[str]) -> bool:
        seen = report(core, node)
        return seen is not None and set(seen.busy) == want

    held = {"FAB001", cxl_memdev, cxl_id}  # CXL memory by memdev, and serial for controllers before
    wait_for("held devices reported busy", lambda: busy(held), timeout=30)
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert list(plugin.cdi_root.glob("*.json")) == []
    wait_for("released devices no longer busy", lambda: busy(set()), timeout=30)
