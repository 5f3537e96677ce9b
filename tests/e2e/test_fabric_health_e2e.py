"""A fabric GPU that fails (issue 38, the fabric path) on the real control plane.

The controller runs with ``--fabric-pool-shape=per-domain``; the plugins are
real processes reading NVML through our mock on simulated hosts. Pod
``sick`` runs on gpu-0 (attached to the first node), pod ``hold`` on gpu-1,
and pod ``waiting`` asks for any sw0 GPU: none is free. The first node's
simulated host raises XID 64 (row remapping failed: the replace class) on
gpu-0. Then, in order (well under a second here): the plugin names gpu-0
failed in its fabric report; the controller taints it ``NoExecute`` in its
domain pool; kube-controller-manager's device-taint eviction deletes
``sick``; once the node unprepared its claim the controller detaches gpu-0
and holds it out (``NoSchedule``, the reason as value), so ``waiting`` does
not get it; ``hold`` goes, and ``waiting`` gets gpu-1. gpu-0 was asked for
once, and is not attached again.

Then the operator clears it (``patchbay.dev/fabric-clear`` on a Node, after
repairing it): the controller offers it again, and a pod on the same node
gets it and keeps it. The node ended its own record of gpu-0 with the
detach (``detached`` in its ``patchbay.dev/health``), so its fabric report
does not name the GPU failed again (it did, with the old record: tainted
``NoExecute`` at once, the pod evicted).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from driver.controller.health.failures import CLEAR_ANNOTATION, TIME_FORMAT
from driver.fabric_devices.naming import NodeFabric
from driver.health.history import NodeHealth
from driver.health.records import DETACHED
from tests.e2e.fabric_helpers import (
    Env,
    FabricLayout,
    SwitchLayout,
    attr,
    fabric_pool,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pods import claim_of, gone, phase, pod

pytestmark = pytest.mark.cluster
LAYOUT = FabricLayout((SwitchLayout("sw0", "adapter0", gpus=("gpu-0", "gpu-1")),))
KEY = "patchbay.dev/unhealthy"


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return LAYOUT


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return ("--fabric-pool-shape=per-domain",)


def device(resource_api: Any, fabric_id: str) -> Any:
    return next(d for d in fabric_pool(resource_api).values()
                if attr(d, "fabricDevice") == fabric_id)  # fmt: skip


def taints(resource_api: Any, fabric_id: str) -> list[tuple[str, str, str]]:
    return [(t.key, t.value, t.effect) for t in device(resource_api, fabric_id).taints or ()]


def sw0_gpu() -> dict[str, Any]:
    cel = 'device.attributes["patchbay.dev"].fabricSwitch == "sw0"'
    return {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev",
                                      "selectors": [{"cel": {"expression": cel}}]}}  # fmt: skip


def test_a_failed_fabric_gpu_is_tainted_evicted_detached_held_out_and_not_offered_again(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, first = namespace, env.nodes[0].name
    for name, gpu in (("sick", "gpu-0"), ("hold", "gpu-1")):
        pod(core, ns, name, first, template(resource_api, ns, name,
                                           [gpu_request(fabric_device=gpu)]))  # fmt: skip
        running(env, core, ns, name)
    pod(core, ns, "waiting", None, template(resource_api, ns, "waiting", [sw0_gpu()]))
    uuid = attr(device(resource_api, "gpu-0"), "uuid")
    assert taints(resource_api, "gpu-0") == [] and env.fabric.connections()["gpu-0"][0] == first

    env.nodes[0].host.nvml.queue_xid(uuid, 64)  # row remapping failed: replace class
    # All of it takes well under a second: each step is read from what stays.
    # Nothing but the device-taint eviction deletes the pod.
    wait_for("sick evicted", lambda: phase(core, ns, "sick") == "Gone", timeout=60)
    wait_for("gpu-0 detached", lambda: env.check_alive()
             and "gpu-0" not in env.fabric.connections(), timeout=60)  # fmt: skip
    wait_for("gpu-0 held out", lambda: taints(resource_api, "gpu-0")
             == [(KEY, "xid-64", "NoSchedule")], timeout=30)  # fmt: skip
    # The controller learnt it from the node's report alone, and tainted it NoExecute.
    (bad,) = wait_for("FabricDeviceUnhealthy", lambda: events_about(
        core, "default", first, "FabricDeviceUnhealthy"), timeout=30)  # fmt: skip
    assert "gpu-0" in bad.message and "xid-64 (replace class); tainted NoExecute" in bad.message
    (held,) = wait_for("FabricDeviceHeldOut", lambda: events_about(
        core, "default", first, "FabricDeviceHeldOut"), timeout=30)  # fmt: skip
    assert "gpu-0" in held.message and "xid-64" in held.message, held.message
    assert phase(core, ns, "waiting") == "Pending"
    gone(core, ns, "hold")
    running(env, core, ns, "waiting")
    (result,) = claim_of(core, resource_api, ns, "waiting").status.allocation.devices.results
    assert attr(fabric_pool(resource_api)[result.device], "fabricDevice") == "gpu-1"
    asked = Counter(r["target"] for r in env.fabric.attach_requests())
    assert asked["gpu-0"] == 1 and "gpu-0" not in env.fabric.connections()
    assert taints(resource_api, "gpu-0") == [(KEY, "xid-64", "NoSchedule")]
    gone(core, ns, "waiting")
    # The node's record ended with the detach; its story stays on the Node.
    wait_for("the node's record of gpu-0 ended by its detach",
             lambda: gpu_state(core, first, uuid) == DETACHED, timeout=30)  # fmt: skip

    # Repaired, the operator clears it: offered again, and a pod on that node gets it.
    clear = f"gpu-0@{time.strftime(TIME_FORMAT, time.gmtime())}"
    core.patch_node(first, {"metadata": {"annotations": {CLEAR_ANNOTATION: clear}}})
    try:
        wait_for("gpu-0 offered again", lambda: taints(resource_api, "gpu-0") == [], timeout=60)
        pod(core, ns, "again", first, template(resource_api, ns, "again",
                                               [gpu_request(fabric_device="gpu-0")]))  # fmt: skip
        running(env, core, ns, "again")
        # The node's report that let the pod bind (the attach seen) names nothing failed.
        report = NodeFabric.from_node(node_view(core, first))
        assert report is not None and uuid in report.gpus and report.failed == {}, report
        assert taints(resource_api, "gpu-0") == [] and phase(core, ns, "again") == "Running"
        assert env.fabric.connections()["gpu-0"][0] == first
        gone(core, ns, "again")
    finally:
        core.patch_node(first, {"metadata": {"annotations": {CLEAR_ANNOTATION: None}}})


def gpu_state(core: Any, node: str, uuid: str) -> str | None:
    """The GPU's state in the Node's ``patchbay.dev/health`` annotation."""
    health = NodeHealth.from_node(node_view(core, node))
    story = health.gpus.get(uuid) if health is not None else None
    return story.state if story is not None else None


def node_view(core: Any, name: str) -> dict[str, Any]:
    """The Node's annotations, in the shape the annotation readers take."""
    return {"metadata": {"annotations": core.read_node(name).metadata.annotations or {}}}
