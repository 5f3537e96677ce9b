"""The real plugin process: real sockets, pynvml + the C mock, a simulated
host, the real apiserver; this test plays the kubelet.

Covers registration, slices published from NVML/sysfs discovery, a batch in
which one claim fails and the other succeeds, idempotent prepare, and crash
safety: the plugin is SIGKILLed at each step of a prepare and the next call
converges with nothing leaked.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from driver.faults import PREPARE_POINTS, UNPREPARE_POINTS
from plugin.proto import (
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from tests.checkpoint_view import recorded
from tests.e2e.helpers import unchanged, wait_for
from tests.harness.simnode import PluginProcess
from tests.integration import plugin_fixtures
from tests.integration.kubelet import our_slices, wait_registered
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
node = plugin_fixtures.node  # its fixtures: a Node object, a plugin process for it
plugin = plugin_fixtures.plugin


def test_registration_and_slices(
    plugin: PluginProcess, resource_api: client.ResourceV1Api, node: str
) -> None:
    kubelet = wait_registered(plugin)
    info = kubelet.get_info()
    assert info.type == "DRAPlugin" and info.name == "patchbay.dev"
    assert Path(info.endpoint).is_absolute() and Path(info.endpoint).exists()
    assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

    wait_for("slice published", lambda: len(our_slices(resource_api, node)) == 1, timeout=30)
    (slc,) = our_slices(resource_api, node)
    assert slc.spec.driver == "patchbay.dev" and slc.spec.pool.name == node
    assert slc.metadata.owner_references[0].kind == "Node"
    uuids = set(plugin.host.gpu_uuids().values())
    published = {d.attributes["uuid"].string for d in slc.spec.devices}
    assert published == uuids
    roots = {d.attributes["resource.kubernetes.io/pcieRoot"].string for d in slc.spec.devices}
    assert all(r.startswith("pci0000:") for r in roots)


def test_batch_idempotency_and_isolation(
    plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str, node: str
) -> None:
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    good = allocated_claim(resource_api, namespace, "good", node, ["gpu-0"])
    bad = allocated_claim(resource_api, namespace, "bad", node, ["gpu-7"])
    claims = [(namespace, "good", good), (namespace, "bad", bad)]
    wait_for("devices discovered", lambda: len(our_slices(resource_api, node)) == 1, timeout=30)
    first = kubelet.prepare(endpoint, claims)
    assert first[good].error == "", first[good].error
    assert "gpu-7" in first[bad].error
    (dev,) = first[good].devices
    assert dev.device_name == "gpu-0" and list(dev.request_names) == ["req-0"]
    claim_id = f"k8s.patchbay.dev/claim={good}"  # the device, its request's metadata file
    assert list(dev.cdi_device_ids) == [f"{claim_id}-gpu-0", f"{claim_id}-metadata_req-0"]
    again = kubelet.prepare(endpoint, claims[:1])
    assert again[good].devices == first[good].devices
    spec = json.loads((plugin.cdi_root / f"k8s.patchbay.dev-claim_{good}.json").read_text())
    (gpu0,) = [
        d for s in our_slices(resource_api, node) for d in s.spec.devices if d.name == "gpu-0"
    ]
    # The claim's GPUs are listed once, in the spec's own edits (not per device).
    visible = f"NVIDIA_VISIBLE_DEVICES={gpu0.attributes['uuid'].string}"
    assert spec["containerEdits"]["env"] == [visible]
    assert kubelet.unprepare(endpoint, claims[:1])[good].error == ""
    assert kubelet.unprepare(endpoint, claims[:1])[good].error == ""
    assert list(plugin.cdi_root.glob("*.json")) == []


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_at_each_prepare_step_converges(
    point: str, plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str, node: str
) -> None:
    kubelet = wait_registered(plugin)
    uid = allocated_claim(resource_api, namespace, "c", node, ["gpu-1"])
    claim = [(namespace, "c", uid)]
    wait_for("devices discovered", lambda: len(our_slices(resource_api, node)) == 1, timeout=30)
    plugin.stop()
    plugin.start(PATCHBAY_CRASH_POINT=point)
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    with pytest.raises(grpc.RpcError):
        kubelet.prepare(endpoint, claim)
    assert plugin.wait_exit(10) != 0, "the plugin should have been killed at the crash point"
    plugin.start()
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    assert_specs_match_checkpoint(plugin)
    result = kubelet.prepare(endpoint, claim)[uid]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == ["gpu-1"]
    checkpoint = recorded(plugin.plugin_dir / "checkpoint.json")
    assert checkpoint["claims"][uid]["state"] == "PrepareCompleted"
    assert [p.name for p in plugin.cdi_root.glob("*.json")] == [
        f"k8s.patchbay.dev-claim_{uid}.json"
    ]
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert list(plugin.cdi_root.glob("*.json")) == []
    checkpoint = recorded(plugin.plugin_dir / "checkpoint.json")
    assert checkpoint["claims"] == {}
    assert list((plugin.plugin_dir / "dra-device-metadata").glob("*.json")) == []
    # No temp debris: only the running plugin's spare of the checkpoint.
    assert plugin.proc is not None
    spare = f".checkpoint.json.tmp-{plugin.proc.pid}"
    leftovers = [p.name for p in plugin.plugin_dir.iterdir() if ".tmp-" in p.name]
    assert set(leftovers) <= {spare}


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_crash_at_each_unprepare_step_converges(
    point: str, plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str, node: str
) -> None:
    kubelet = wait_registered(plugin)
    uid = allocated_claim(resource_api, namespace, "c", node, ["gpu-1"])
    claim = [(namespace, "c", uid)]
    wait_for("devices discovered", lambda: len(our_slices(resource_api, node)) == 1, timeout=30)
    plugin.stop()
    plugin.start(PATCHBAY_CRASH_POINT=point)
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    assert kubelet.prepare(endpoint, claim)[uid].error == ""
    with pytest.raises(grpc.RpcError):
        kubelet.unprepare(endpoint, claim)
    assert plugin.wait_exit(10) != 0, "the plugin should have been killed at the crash point"
    plugin.start()
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    assert_specs_match_checkpoint(plugin)
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert list(plugin.cdi_root.glob("*.json")) == []
    checkpoint = recorded(plugin.plugin_dir / "checkpoint.json")
    assert checkpoint["claims"] == {}
    assert list((plugin.plugin_dir / "dra-device-metadata").glob("*.json")) == []


def assert_specs_match_checkpoint(plugin: PluginProcess) -> None:
    """After a restart: every prepared claim has its CDI spec, no spec is left
    without its claim's record (start-up recovery ran before registration)."""
    path = plugin.plugin_dir / "checkpoint.json"
    claims = recorded(path)["claims"]
    prepared = {u for u, c in claims.items() if c["state"] == "PrepareCompleted"}
    prefix = "k8s.patchbay.dev-claim_"
    specs = {p.name[len(prefix) : -len(".json")] for p in plugin.cdi_root.glob(f"{prefix}*.json")}
    assert prepared <= specs, "a prepared claim lost its CDI spec"
    assert specs <= set(claims), "a CDI spec outlived its claim"
    metadata = plugin.plugin_dir / "dra-device-metadata"
    files = {p.name.split("_")[0] for p in metadata.glob("*.json")}  # <uid>_<request>.json
    assert files <= set(claims), "device metadata outlived its claim"


def test_health_stream_reports_a_critical_xid(
    plugin: PluginProcess, resource_api: client.ResourceV1Api, node: str
) -> None:
    kubelet = wait_registered(plugin)
    info = kubelet.get_info()
    assert "v1alpha1.DRAResourceHealth" in info.supported_versions
    wait_for("slices published", lambda: our_slices(resource_api, node), timeout=30)
    uuid = {
        d.name: d.attributes["uuid"].string
        for s in our_slices(resource_api, node)
        for d in s.spec.devices or []
    }
    with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
        stub = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch)
        stream = stub.NodeWatchResources(
            health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=60
        )
        first = next(stream)
        healthy = health_v1alpha1_pb2.HEALTHY
        assert {d.device.device_name: d.health for d in first.devices} == {
            "gpu-0": healthy,
            "gpu-1": healthy,
        }
        plugin.host.nvml.queue_xid(uuid["gpu-1"], 48)  # double-bit ECC error
        for update in stream:
            bad = {
                d.device.device_name: d.message
                for d in update.devices
                if d.health == health_v1alpha1_pb2.UNHEALTHY
            }
            if bad:  # its recovery phase may have moved on: (reset class, resetting) ...
                assert list(bad) == ["gpu-1"], bad
                assert bad["gpu-1"].startswith("GPU reported critical XID 48 (reset class,")
                break
        stream.cancel()

    # The unhealthy GPU is also tainted in its slice, and the pool settles.
    def taints() -> dict[str, list[tuple[str, str, str]]]:
        return {
            d.name: [(t.key, t.value, t.effect) for t in d.taints or []]
            for s in our_slices(resource_api, node)
            for d in s.spec.devices or []
        }

    want = {"gpu-0": [], "gpu-1": [("patchbay.dev/unhealthy", "xid-48", "NoExecute")]}
    wait_for("gpu-1 tainted", lambda: taints() == want, timeout=30)
    unchanged(resource_api.list_resource_slice, "the settled pool", 2,
              field_selector=f"spec.nodeName={node}")  # fmt: skip
