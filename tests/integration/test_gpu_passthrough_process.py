"""GPU passthrough through the real plugin process: a claim of class
``vfio-gpu.patchbay.dev`` (its class config asks for ``vfio-pci``) is prepared
over the real socket, the simulated host's GPU moves to ``vfio-pci``, the CDI
spec gives the vfio nodes, the GPU leaves the published slice while it is
there, and unprepare puts it back on ``nvidia`` and in the slice."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from driver.config.opaque import API_VERSION
from tests.e2e.helpers import wait_for
from tests.harness.simnode import PluginProcess
from tests.integration import plugin_fixtures
from tests.integration.kubelet import our_slices, wait_registered
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PASSTHROUGH = {
    "driver": "patchbay.dev",
    "parameters": {"apiVersion": API_VERSION, "kind": "GpuConfig", "passthrough": "vfio-pci"},
}


node = plugin_fixtures.node  # a Node, and a plugin process on a 2-GPU host for it
plugin = plugin_fixtures.plugin


def published(api: client.ResourceV1Api, node: str) -> dict[str, str]:
    """Published GPU device name -> its PCI address."""
    return {
        d.name: d.attributes["resource.kubernetes.io/pciBusID"].string
        for s in our_slices(api, node)
        for d in s.spec.devices or []
    }


def test_vfio_gpu_claim_rebinds_hides_and_restores(
    plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str, node: str
) -> None:
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    wait_for("GPUs published", lambda: "gpu-0" in published(resource_api, node), timeout=30)
    bdf = published(resource_api, node)["gpu-0"]
    assert plugin.host.tree.driver_of(bdf) == "nvidia"
    config = [{"source": "FromClass", "requests": ["req-0"], "opaque": PASSTHROUGH}]
    uid = allocated_claim(resource_api, namespace, "vm", node, ["gpu-0"], config=config)
    claim = [(namespace, "vm", uid)]

    result = kubelet.prepare(endpoint, claim)[uid]
    assert result.error == "", result.error
    assert plugin.host.tree.driver_of(bdf) == "vfio-pci"
    group = (plugin.host.tree.path_of(bdf) / "iommu_group").resolve().name
    spec = json.loads((plugin.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").read_text())
    nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    assert {"/dev/vfio/vfio", f"/dev/vfio/{group}"} <= nodes
    assert "NVIDIA_VISIBLE_DEVICES" not in json.dumps(spec)
    # NVML no longer sees it: nothing of this GPU is offered for other uses.
    wait_for("gpu-0 unpublished", lambda: bdf not in published(resource_api, node).values(), 30)

    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert plugin.host.tree.driver_of(bdf) == "nvidia"
    wait_for("gpu-0 published again", lambda: bdf in published(resource_api, node).values(), 30)
