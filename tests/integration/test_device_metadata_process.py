"""Device metadata files (KEP-5304) on the wire: the real plugin process, its
real socket, the real apiserver; this test plays the kubelet.

The NodePrepareResources answer carries the metadata CDI ID on the first
device of each request, the claim's CDI spec mounts the file read-only at the
upstream container path, the file names the device with the pciBusID its
ResourceSlice publishes, and unprepare removes it. Fails without the feature
(no ID, no mount, no file).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from driver.claims.metadata import CONTAINER_DIR, read_stream
from tests.e2e.helpers import wait_for
from tests.harness.simnode import PluginProcess
from tests.integration import plugin_fixtures
from tests.integration.kubelet import our_slices, wait_registered
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
node = plugin_fixtures.node  # its fixtures: a Node object, a plugin process for it
plugin = plugin_fixtures.plugin


def test_metadata_file_and_its_cdi_mount(
    plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str, node: str
) -> None:
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    uid = allocated_claim(resource_api, namespace, "meta", node, ["gpu-1"])
    wait_for("devices discovered", lambda: len(our_slices(resource_api, node)) == 1, timeout=30)
    claim = [(namespace, "meta", uid)]
    result = kubelet.prepare(endpoint, claim)[uid]
    assert result.error == ""
    (dev,) = result.devices
    meta_id = f"k8s.patchbay.dev/claim={uid}-metadata_req-0"
    assert list(dev.cdi_device_ids) == [f"k8s.patchbay.dev/claim={uid}-gpu-1", meta_id]

    spec = json.loads((plugin.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").read_text())
    (entry,) = [d for d in spec["devices"] if d["name"] == f"{uid}-metadata_req-0"]
    (mount,) = entry["containerEdits"]["mounts"]
    assert mount["containerPath"] == (
        f"{CONTAINER_DIR}/resourceclaims/meta/req-0/patchbay.dev-metadata.json"
    )
    assert "ro" in mount["options"] and "bind" in mount["options"]
    host = Path(mount["hostPath"])
    assert host.is_relative_to(plugin.plugin_dir)

    docs = read_stream(host.read_bytes())
    assert [d["apiVersion"] for d in docs] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    (gpu1,) = [
        d for s in our_slices(resource_api, node) for d in s.spec.devices if d.name == "gpu-1"
    ]
    (device,) = docs[0]["requests"][0]["devices"]
    assert device["name"] == "gpu-1" and device["pool"] == node
    assert device["attributes"][PCI_BUS_ID] == {"string": gpu1.attributes[PCI_BUS_ID].string}

    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert not host.exists()
    assert list((plugin.plugin_dir / "dra-device-metadata").glob("*.json")) == []
