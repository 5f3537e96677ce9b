"""Idle devices on the real control plane (issue 37, the node's half).

Why: the plugin reports a device idle by writing the condition ``Idle`` in
its claim's ``status.devices`` entry. That write is allowed only as the
chart grants it: ``patch`` on ``resourceclaims/status`` and the verb
``associated-node:patch`` on ``resourceclaims/driver`` for ``patchbay.dev``,
which the apiserver honours only for a ServiceAccount token bound to a pod
on the claim's node. So the plugin here runs as the chart makes it: the
chart's plugin RBAC and policies rendered with the pinned helm, and a token
bound to a Pod on its node (``tests.e2e.plugin_token``).

- A real plugin process on a simulated node with two H100s (NVML through
  pynvml and the C mock) prepares two claims; the mock says one GPU is at
  1 % and the other at 90 %. The idle one gets ``Idle=True`` once the
  window has passed; the busy one, sampled in the same rounds, gets no
  condition at all; the idle one set busy gets ``Idle=False``.
- With the plugin's token: the apply leaves ``FabricDeviceReady`` (written
  as the controller writes it, read-modify-write) in place, and the
  controller's next write keeps ``Idle``; a claim allocated to another
  node, and another driver's entry, are refused.

Every wait is on the claim itself (the condition appearing), never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from driver.errors import ApiStatusError
from driver.idle.conditions import ConditionWriter, apply_body, condition, field_manager
from driver.idle.sources import Held
from driver.kube.api import KubeApi, claim_path
from tests.e2e.chart import Applier
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.plugin_nodes import node_devices, published_devices
from tests.e2e.plugin_token import install_plugin_rbac, pod_bound_token, token_kubeconfig
from tests.e2e.pods import gone, pod, running
from tests.harness.simnode import SimNode, apply_deviceclasses, build_nvml_mock

pytestmark = pytest.mark.cluster

WINDOW_S = 3
IDLE_ARGS = ("--idle-sample-interval=0.5", f"--idle-window={WINDOW_S}", "--idle-threshold=10",
             "--mig-gpus=all")  # fmt: skip
BUSY, LOW = 90, 1


@dataclass(frozen=True)
class IdleNode:
    node: SimNode
    namespace: str
    kubeconfig: Path  # the plugin's pod-bound token


@pytest.fixture(scope="module")
def idle_node(
    helm: Path,
    local_cluster: Any,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[IdleNode]:
    build_nvml_mock()
    apply_deviceclasses(resource_api)
    namespace = unique("pbidle")
    core.create_namespace({"metadata": {"name": namespace}})
    applier = Applier(api_client)
    name = unique("idle")
    node: SimNode | None = None
    try:
        sa, _ = install_plugin_rbac(helm, applier, unique("pbi"), namespace)
        _, token = pod_bound_token(core, namespace, sa, name)
        kubeconfig = token_kubeconfig(
            tmp_path_factory.mktemp("idle") / "plugin.kubeconfig", local_cluster, token
        )
        node = SimNode(local_cluster, name, "2-gpus", kubeconfig, plugin_args=IDLE_ARGS)
        for uuid in node.host.gpu_uuids().values():
            node.host.nvml.set_utilization(uuid, BUSY)
        node.start()

        def published() -> bool:
            assert node is not None
            node.check_alive()
            return published_devices(resource_api, name) >= 2

        wait_for("both GPUs published", published, timeout=90)
        yield IdleNode(node, namespace, kubeconfig)
    finally:
        if node is not None:
            node.stop()
        applier.cleanup()
        with contextlib.suppress(client.ApiException):
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_quietly(core.delete_node, name)
        delete_quietly(core.delete_namespace, namespace)


def gpu_claim(
    resource_api: client.ResourceV1Api, ns: str, name: str, device_class: str = "gpu.patchbay.dev"
) -> None:
    resource_api.create_namespaced_resource_claim(ns, {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": device_class}},
        ]}},
    })  # fmt: skip


def claim_json(api_client: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The claim as JSON (camelCase, managedFields included)."""
    claim = client.ResourceV1Api(api_client).read_namespaced_resource_claim(name, ns)
    got = api_client.sanitize_for_serialization(claim)
    assert isinstance(got, dict)
    return got


def conditions(claim: dict[str, Any], device: str) -> dict[str, dict[str, Any]]:
    entries = (claim.get("status") or {}).get("devices") or []
    return {c["type"]: c for e in entries if e["device"] == device
            for c in e.get("conditions") or ()}  # fmt: skip


def allocated_device(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def gpu_uuid(resource_api: client.ResourceV1Api, node: str, device: str) -> str:
    for d in node_devices(resource_api, node):
        if d.name == device:
            attrs = d.attributes or {}
            attr = attrs.get("uuid") or attrs.get("patchbay.dev/uuid")
            assert attr is not None, attrs
            return str(attr.string)
    raise AssertionError(f"{device} is not published on {node}")


def test_a_gpu_low_for_the_window_gets_idle_and_a_busy_one_nothing(
    idle_node: IdleNode,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
) -> None:
    ns, node = idle_node.namespace, idle_node.node
    for name in ("quiet", "busy"):
        gpu_claim(resource_api, ns, name)
        pod(core, ns, name, node.name, {"resourceClaimName": name})
    try:
        for name in ("quiet", "busy"):
            running(core, ns, name, alive=node.check_alive)
        quiet, busy = (claim_json(api_client, ns, n) for n in ("quiet", "busy"))
        quiet_dev, busy_dev = allocated_device(quiet), allocated_device(busy)
        node.host.nvml.set_utilization(gpu_uuid(resource_api, node.name, quiet_dev), LOW)

        def idle_written() -> dict[str, Any] | None:
            node.check_alive()
            return conditions(claim_json(api_client, ns, "quiet"), quiet_dev).get("Idle")

        cond = wait_for("Idle on the quiet GPU's claim", idle_written, timeout=120)
        assert (cond["status"], cond["reason"]) == ("True", "BelowThreshold"), cond
        assert f"below 10% for {WINDOW_S}s" in cond["message"], cond
        # Sampled in the same rounds for as long: never low, never written.
        assert conditions(claim_json(api_client, ns, "busy"), busy_dev) == {}
        managers = {
            (f["manager"], f["operation"], f.get("subresource"))
            for f in claim_json(api_client, ns, "quiet")["metadata"]["managedFields"]
        }
        assert ("patchbay.dev/idle/" + quiet_dev, "Apply", "status") in managers, managers

        node.host.nvml.set_utilization(gpu_uuid(resource_api, node.name, quiet_dev), BUSY)

        def cleared() -> dict[str, Any] | None:
            got = idle_written()
            return got if got is not None and got["status"] == "False" else None

        cond = wait_for("Idle=False once the GPU is busy again", cleared, timeout=60)
        assert cond["reason"] == "Busy", cond
    finally:
        gone(core, ns, "quiet", "busy")
        for name in ("quiet", "busy"):
            delete_quietly(resource_api.delete_namespaced_resource_claim, name, ns)


def test_a_mig_device_is_read_through_gpm(
    idle_node: IdleNode,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
) -> None:
    """A MIG device's utilization is its GPU instance's SM utilization from two
    GPM samples (pynvml and the C mock in the plugin process): an instance the
    mock holds at 0 % (as created) gets Idle=True, set busy Idle=False."""
    ns, node = idle_node.namespace, idle_node.node
    gpu_claim(resource_api, ns, "slice", "mig-3g.patchbay.dev")
    pod(core, ns, "slice", node.name, {"resourceClaimName": "slice"})
    try:
        running(core, ns, "slice", alive=node.check_alive)
        device = allocated_device(claim_json(api_client, ns, "slice"))
        (gpu,) = [g for g in node.host.nvml.read()["gpus"] if g["gpu_instances"]]
        (gi,) = gpu["gpu_instances"]

        def idle() -> dict[str, Any] | None:
            node.check_alive()
            return conditions(claim_json(api_client, ns, "slice"), device).get("Idle")

        cond = wait_for("Idle on the MIG device's claim", idle, timeout=120)
        assert (cond["status"], cond["reason"]) == ("True", "BelowThreshold"), cond
        node.host.nvml.set_utilization(gpu["uuid"], BUSY, gi_id=gi["id"])

        def cleared() -> dict[str, Any] | None:
            got = idle()
            return got if got is not None and got["status"] == "False" else None

        cond = wait_for("Idle=False once the GPU instance is busy", cleared, timeout=60)
        assert cond["reason"] == "Busy", cond
    finally:
        gone(core, ns, "slice")
        delete_quietly(resource_api.delete_namespaced_resource_claim, "slice", ns)


def allocated_claim(
    resource_api: client.ResourceV1Api, ns: str, name: str, node: str, device: str
) -> dict[str, Any]:
    """A claim allocated by hand (as admin) to ``device`` of ``node``'s pool,
    a device nothing publishes: no scheduler decision is involved."""
    gpu_claim(resource_api, ns, name)
    allocation = {
        "devices": {"results": [
            {"request": "gpu", "driver": "patchbay.dev", "pool": node, "device": device},
        ]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]},
        ]}]},
    }  # fmt: skip
    got = resource_api.patch_namespaced_resource_claim_status(
        name, ns, {"status": {"allocation": allocation}}
    )
    return {"uid": got.metadata.uid, "device": device}


def controller_write(
    resource_api: client.ResourceV1Api, ns: str, name: str, device: str, status: str
) -> None:
    """``FabricDeviceReady`` as the controller writes it (driver/controller/attach/
    status.py): the whole ``status.devices`` list read, changed and sent back
    with the resourceVersion, by a manager of its own."""
    from driver.controller.claims import devices_with_condition  # the controller's own

    claim = claim_json(resource_api.api_client, ns, name)
    cond = {"type": "FabricDeviceReady", "status": status, "reason": "Attached",
            "message": "", "lastTransitionTime": "2026-12-03T16:00:00Z"}  # fmt: skip
    body = {
        "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
        "status": {"devices": devices_with_condition(claim, device_pool(claim), device, cond)},
    }
    resource_api.patch_namespaced_resource_claim_status(name, ns, body)


def device_pool(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["pool"])


def test_the_plugins_token_writes_idle_beside_the_controllers_condition_on_its_node_only(
    idle_node: IdleNode, api_client: client.ApiClient, resource_api: client.ResourceV1Api
) -> None:
    ns, node = idle_node.namespace, idle_node.node.name
    own = allocated_claim(resource_api, ns, "own", node, "gpu-9")
    elsewhere_node = unique("elsewhere")
    other = allocated_claim(resource_api, ns, "other", elsewhere_node, "gpu-9")
    controller_write(resource_api, ns, "own", "gpu-9", "True")

    async def as_plugin() -> None:
        api = await KubeApi.connect(str(idle_node.kubeconfig))
        try:
            writer = ConditionWriter(api)
            held = Held(own["uid"], ns, "own", node, "gpu-9", None)
            now = datetime.now(UTC)
            assert await writer.write(held, condition(True, "BelowThreshold", "idle", now))
            assert await writer.idle_now(held) is True
            got = conditions(claim_json(api_client, ns, "own"), "gpu-9")
            assert {t: c["status"] for t, c in got.items()} == {
                "FabricDeviceReady": "True", "Idle": "True"}  # fmt: skip
            controller_write(resource_api, ns, "own", "gpu-9", "True")  # keeps Idle
            got = conditions(claim_json(api_client, ns, "own"), "gpu-9")
            assert got["Idle"]["status"] == "True", got
            assert await writer.write(held, condition(False, "Busy", "busy", now))
            got = conditions(claim_json(api_client, ns, "own"), "gpu-9")
            assert {t: c["status"] for t, c in got.items()} == {
                "FabricDeviceReady": "True", "Idle": "False"}  # fmt: skip

            # Another node's claim: the associated-node verb does not reach it.
            elsewhere = Held(other["uid"], ns, "other", elsewhere_node, "gpu-9", None)
            body = apply_body(elsewhere, condition(True, "BelowThreshold", "idle", now))
            with pytest.raises(ApiStatusError) as refused:
                await api.apply(claim_path(ns, "other") + "/status", body,
                                field_manager(elsewhere), force=True)  # fmt: skip
            assert refused.value.status in (403, 422), refused.value
            assert "resourceclaims/driver" in str(refused.value), refused.value
            # Its own node's claim, but another driver's entry.
            body = apply_body(held, condition(True, "BelowThreshold", "idle", now))
            body["status"]["devices"][0]["driver"] = "other.example.com"
            with pytest.raises(ApiStatusError) as refused:
                await api.apply(claim_path(ns, "own") + "/status", body,
                                field_manager(held), force=True)  # fmt: skip
            assert refused.value.status in (403, 422), refused.value
            assert "resourceclaims/driver" in str(refused.value), refused.value
        finally:
            await api.close()

    try:
        asyncio.run(as_plugin())
    finally:
        for name in ("own", "other"):
            delete_quietly(resource_api.delete_namespaced_resource_claim, name, ns)
