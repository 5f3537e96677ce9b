"""Fabric GPUs from a count-based manager (the ``count`` dialect) on the real control plane.

The simulated fabric serves its count face (Fujitsu-FM-shaped: "one GPU of
model X to machine M", the manager picks it); the controller runs with
``--fabric-dialect=count`` and learns each node's machine id from a Node
label (``--fabric-machine-key``). A claim runs on the device the manager
chose; its status names that device; the node's plugin prepared it; one
scale-up per allocation; deleting the pod scales it down; a manager that
attaches another model fails the claim naming what arrived.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from fabric.service.hardware import system_uuid
from tests.e2e.fabric_helpers import (
    Env,
    FabricLayout,
    SwitchLayout,
    attr,
    conditions,
    fabric_pool,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pods import claim_of, gone, pod

pytestmark = pytest.mark.cluster
TENANT = "0d7c1e2a-5b8f-4c3e-9a61-7f2b4c8d9e10"
KEY = "patchbay.dev/test-machine"
H200 = "H200-SXM5-141GB"


class MixedLayout(FabricLayout):
    """sw0: gpu-0, gpu-1 (H100) behind adapter0; sw1: gpu-2, an H200, behind adapter1."""

    def spec(self, nodes: list[Any]) -> dict[str, Any]:
        out = super().spec(nodes)
        for sw in out["switches"]:
            for slot in sw["slots"]:
                if slot["device"]["id"] == "gpu-2":
                    slot["device"]["model"] = H200
        return out


@pytest.fixture(scope="module")
def fabric_dialect() -> str:
    return "count"


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return MixedLayout(
        (
            SwitchLayout("sw0", "adapter0", gpus=("gpu-0", "gpu-1")),
            SwitchLayout("sw1", "adapter1", gpus=("gpu-2",)),
        )
    )


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return (f"--fabric-count-tenant={TENANT}", f"--fabric-machine-key={KEY}")


@pytest.fixture(scope="module")
def machines(env: Env, core: Any) -> Iterator[Env]:
    """Each node labelled with its machine id, seen by the controller (its log line)."""
    for n in env.nodes:
        core.patch_node(n.name, {"metadata": {"labels": {KEY: system_uuid(n.name)}}})
    for n in env.nodes:
        line = f"count fabric: node {n.name} is machine {system_uuid(n.name)}"
        wait_for(
            f"the controller's {line!r}",
            lambda line=line: line in env.ctl.log_path.read_text(),
            timeout=60,
        )
    yield env


def scale_ups(env: Env) -> list[tuple[str, str]]:
    return [
        (r["target"], r["initiator"])
        for r in env.fabric.attach_requests()
        if r["dialect"] == "count"
    ]


def report(core: Any, node: str) -> dict[str, Any]:
    raw = core.read_node(node).metadata.annotations.get("patchbay.dev/fabric", "{}")
    return dict(json.loads(raw))


def test_a_claim_runs_on_the_device_the_manager_chose(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    env, ns, node = machines, namespace, machines.nodes[0].name
    before = scale_ups(env)
    tmpl = template(resource_api, ns, "count", [gpu_request(fabric_device="gpu-0")])
    pod(core, ns, "count", node, tmpl)
    running(env, core, ns, "count", timeout=150)
    claim = claim_of(core, resource_api, ns, "count")
    (result,) = claim.status.allocation.devices.results
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    # The manager chose gpu-0 (its first free H100 behind the machine): one scale-up.
    assert scale_ups(env)[len(before) :] == [("gpu-0", f"{node}/adapter0")]
    variant = fabric_pool(resource_api)[result.device]
    uuid, serial = attr(variant, "uuid"), attr(variant, "serial")
    (status,) = [d for d in claim.status.devices if d.device == result.device]
    assert status.data["uuid"] == uuid and status.data["fabricDevice"] == "gpu-0"
    assert status.data["serial"] == serial  # the manager's name for it (res_serial_num)
    # The node saw the board serial the manager answered, and holds that GPU prepared.
    seen = wait_for(
        f"{node}'s report: {uuid} held prepared",
        lambda: next((r for r in [report(core, node)] if uuid in r.get("busy", [])), None),
        timeout=30,
    )
    assert seen["serials"][serial] == uuid, seen
    gone(core, ns, "count")
    wait_for("gpu-0 scaled down", lambda: "gpu-0" not in env.fabric.connections(), timeout=60)
    assert scale_ups(env)[len(before) :] == [("gpu-0", f"{node}/adapter0")]


def test_another_model_arriving_fails_the_claim_naming_it(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    env, ns, node = machines, namespace, machines.nodes[1].name
    env.fabric.request("POST", "/patchbay/v1/count-faults", {"wrongModelNext": 1})
    tmpl = template(resource_api, ns, "h200", [gpu_request(fabric_device="gpu-2")])
    pod(core, ns, "wrong", node, tmpl)
    wait_for(
        "the pod's claim",
        lambda: core.read_namespaced_pod("wrong", ns).status.resource_claim_statuses,
        timeout=60,
    )
    claim = claim_of(core, resource_api, ns, "wrong")
    (warning,) = wait_for(
        "the AttachFailed event",
        lambda: events_about(core, ns, claim.metadata.name, "AttachFailed"),
        timeout=90,
    )
    assert warning.type == "Warning"
    assert f"asked one gpu of model {H200} for node {node}" in warning.message
    assert "gpu H100-SXM5-80GB serial" in warning.message, warning.message
    assert "arrived instead; scaled it down again" in warning.message
    assert not env.fabric.connections()  # the H100 that arrived went back
    gone(core, ns, "wrong")
