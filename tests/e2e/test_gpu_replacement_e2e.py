"""A local GPU that must be replaced gets a fabric spare (issue 38, replacement).

The real control plane, scheduler and kube-controller-manager; the plugins
are real processes reading NVML through our mock on simulated hosts with one
local H100 each and two fabric adapters; the controller runs with
``--spares-replace-failed`` (and a spares cap of one of the fabric's two
GPUs), no fixed or demand spares. A Deployment's pod, pinned to the first
node (``nodeSelector``), asks for a GPU as ``firstAvailable``: a local one,
else a warm spare (``gpu.patchbay.dev`` serves both; docs/health.md,
"Replacement"). It runs on the local GPU. The host raises XID 64 (row
remapping failed: the replace class) on that GPU. Then:

- the local GPU is tainted ``NoExecute`` (``DeviceUnhealthy`` on the Node)
  and kube-controller-manager's device-taint eviction deletes the pod;
- the controller attaches exactly one fabric GPU to that node as a spare
  (``SpareAttached``), and the Deployment's replacement pod takes it there
  (``SpareTaken`` on its claim);
- the failed GPU is never reset (no ``nvidia-smi --gpu-reset``, no reset
  Event) and stays tainted, under its name: the spare sits on a lower bus
  (behind adapter0) and NVML numbers it first, but local GPUs are named
  first (``driver.gpu.discovery.local_first``).

Order is read from what stays (the taint, the fabric's attach log, the
Events' order), never from wall-clock durations.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from fabric.simhost.nvidia_smi import read_record
from tests.e2e.burst_audit import checkpoint
from tests.e2e.fabric_helpers import Env, FabricLayout, SwitchLayout, attr, template
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pods import CLAIM, phase

pytestmark = pytest.mark.cluster
LAYOUT = FabricLayout((SwitchLayout("sw0", "adapter0", gpus=("gpu-0", "gpu-1")),))
KEY = "patchbay.dev/unhealthy"
APP = "trainer"
LOCAL_CEL = 'device.attributes["patchbay.dev"].attachment == "local"'
SPARE_CEL = (
    '"spare" in device.attributes["patchbay.dev"] && device.attributes["patchbay.dev"].spare'
)


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return LAYOUT


@pytest.fixture(scope="module")
def node_topology() -> str:
    return "local-gpu-fabric"


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return ("--fabric-pool-shape=per-domain", "--spares-replace-failed=true", "--spares-cap=0.5")


def local_or_spare() -> dict[str, Any]:
    """One GPU: a local one, else a warm spare on the pod's node."""
    subs = [
        {"name": sub, "deviceClassName": "gpu.patchbay.dev",
         "selectors": [{"cel": {"expression": cel}}]}
        for sub, cel in (("local", LOCAL_CEL), ("spare", SPARE_CEL))
    ]  # fmt: skip
    return {"name": "gpu", "firstAvailable": subs}


def deployment(apps: client.AppsV1Api, ns: str, node: str, claim_template: str) -> None:
    labels = {"app": APP}
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "main", "image": "pause",
                        "resources": {"claims": [{"name": CLAIM}]}}],
        "resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": claim_template}],
    }  # fmt: skip
    body = {
        "metadata": {"name": APP},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    }  # fmt: skip
    apps.create_namespaced_deployment(ns, body)


def running_pod(env: Env, core: client.CoreV1Api, ns: str, not_: str = "") -> Any:
    """The Deployment's pod once one (other than ``not_``) runs."""

    def found() -> Any:
        env.check_alive()
        for p in core.list_namespaced_pod(ns, label_selector=f"app={APP}").items:
            live = p.metadata.deletion_timestamp is None and p.status.phase == "Running"
            if live and p.metadata.name != not_:
                return p
        return None

    return wait_for(f"a running {APP} pod", found, timeout=120)


def allocated(resource_api: client.ResourceV1Api, ns: str, pod: Any) -> Any:
    """The one device result of the pod's claim."""
    name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = resource_api.read_namespaced_resource_claim(name, ns)
    (result,) = claim.status.allocation.devices.results
    return claim, result


def node_device(resource_api: client.ResourceV1Api, node: str, uuid: str) -> Any:
    """The device a slice bound to ``node`` publishes for GPU ``uuid`` (its own
    pool or its spares pool)."""
    slices = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return next(d for s in slices for d in (s.spec.devices or [])
                if "uuid" in d.attributes and attr(d, "uuid") == uuid)  # fmt: skip


def slice_with(resource_api: client.ResourceV1Api, pool: str, name: str) -> tuple[Any, Any]:
    """(slice, device) of device ``name`` in ``pool``."""
    slices = resource_api.list_resource_slice(field_selector="spec.driver=patchbay.dev").items
    return next((s, d) for s in slices if s.spec.pool.name == pool
                for d in (s.spec.devices or []) if d.name == name)  # fmt: skip


def in_pool(resource_api: client.ResourceV1Api, pool: str, name: str) -> Any:
    return slice_with(resource_api, pool, name)[1]


def taints(device: Any) -> list[tuple[str, str, str]]:
    return [(t.key, t.value, t.effect) for t in device.taints or ()]


def attaches(env: Env) -> list[tuple[str, str]]:
    """(device, node) of every attach request the fabric got, in order."""
    return [(r["target"], r["initiator"].split("/", 1)[0]) for r in env.fabric.attach_requests()]


def test_a_replace_class_gpu_stays_tainted_and_its_pod_comes_back_on_a_fabric_spare(
    env: Env, api_client: client.ApiClient, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node, host = namespace, env.nodes[0].name, env.nodes[0].host
    deployment(client.AppsV1Api(api_client), ns, node, template(resource_api, ns, APP,
                                                                [local_or_spare()]))  # fmt: skip
    first = running_pod(env, core, ns)
    claim, result = allocated(resource_api, ns, first)
    assert (result.pool, result.device, result.request) == (node, "gpu-0", "gpu/local")
    uuid = attr(in_pool(resource_api, node, "gpu-0"), "uuid")
    assert attaches(env) == []  # no spare before a GPU is lost

    host.nvml.queue_xid(uuid, 64)  # row remapping failed: replace class
    wait_for("gpu-0 tainted NoExecute", lambda: taints(in_pool(resource_api, node, "gpu-0"))
             == [(KEY, "xid-64", "NoExecute")], timeout=60)  # fmt: skip
    wait_for(f"{first.metadata.name} evicted",
             lambda: phase(core, ns, first.metadata.name) == "Gone", timeout=60)  # fmt: skip
    second = running_pod(env, core, ns, not_=first.metadata.name)
    assert second.spec.node_name == node
    claim2, result2 = allocated(resource_api, ns, second)
    assert claim2.metadata.uid != claim.metadata.uid and result2.request == "gpu/spare"
    where, spare = slice_with(resource_api, result2.pool, result2.device)
    fabric_id = attr(spare, "fabricDevice")
    # In the node's spare pool (slice-level nodeName), no binding conditions.
    assert where.spec.node_name == node and result2.pool == f"fabric/spares/{node}"
    assert attr(spare, "attachment") == "fabric" and not spare.binding_conditions
    # Exactly one attach, of that spare to that node, and it is connected there.
    assert attaches(env) == [(fabric_id, node)]
    assert env.fabric.connections()[fabric_id][0] == node

    # The Events tell it in order: the GPU failed, a spare came, a claim took it.
    (bad,) = events_about(core, "default", node, "DeviceUnhealthy")
    assert uuid in bad.message and "NoExecute" in bad.message, bad.message
    (came,) = events_about(core, "default", node, "SpareAttached")
    assert f"fabric device {fabric_id} attached" in came.message, came.message
    (took,) = wait_for("SpareTaken", lambda: events_about(
        core, ns, claim2.metadata.name, "SpareTaken"), timeout=30)  # fmt: skip
    assert f"took warm spare {fabric_id} on node {node}" in took.message, took.message
    assert bad.event_time <= came.event_time <= took.event_time

    # Never reset: the replace class is the fabric's to cure, not the node's.
    # Read once the old claim is unprepared on the node, when a reset-class
    # GPU's reset starts (its spare's pod was running by then too).
    wait_for("the old claim unprepared", lambda: claim.metadata.uid
             not in checkpoint(env.nodes[0]), timeout=60)  # fmt: skip
    calls = read_record(host.dir)["calls"]
    assert isinstance(calls, list)
    assert not [c for c in calls if "--gpu-reset" in c or "-r" in c], calls
    said = {e.reason for e in events_about(core, "default", node)}
    assert not said & {"GpuResetStarted", "GpuReset", "GpuHealthy"}, said
    # Still tainted, under its name: the spare's lower bus renamed no local GPU.
    local = node_device(resource_api, node, uuid)
    assert local.name == "gpu-0" and taints(local) == [(KEY, "xid-64", "NoExecute")]
    buses = {g["uuid"]: g["pci_bus_id"] for g in host.nvml.read()["gpus"]}
    assert buses[attr(spare, "uuid")] < buses[uuid], buses  # NVML's index 0
