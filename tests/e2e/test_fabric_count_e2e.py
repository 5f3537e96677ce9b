"""Fabric GPUs from a count-based manager (the ``count`` dialect) on the real control plane.

The simulated fabric serves its count face (Fujitsu-FM-shaped: "one GPU of
model X to machine M", the manager picks it); the controller runs with
``--fabric-dialect=count`` and learns each node's machine id from a Node
label (``--fabric-machine-key``). A claim runs on the device the manager
chose; its status names that device; the node's plugin prepared it; one
scale-up per allocation; deleting the pod scales it down; a manager that
attaches another model fails the claim naming what arrived; a controller
killed right after the manager's answer is followed by one that takes up
the device that arrived (no second scale-up); a warm spare is what the
manager attached, and a pod that takes it runs with no scale-up of its own. The pool offers
model slots, not devices (docs/fabric.md, "Count-based managers"): a claim
asks for a model, and the switch's counter keeps the scheduler from
allocating more of it than the manager can still attach.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from driver.faults import ENV
from fabric.service.hardware import system_uuid
from tests.e2e.fabric_helpers import (
    Env,
    FabricLayout,
    SwitchLayout,
    attr,
    conditions,
    fabric_pool,
    fabric_slices,
    restart,
    running,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pods import claim_of, gone, pod
from tests.e2e.tenants import container_record, visible

pytestmark = pytest.mark.cluster
TENANT = "0d7c1e2a-5b8f-4c3e-9a61-7f2b4c8d9e10"
KEY = "patchbay.dev/test-machine"
H100, H200 = "H100-SXM5-80GB", "H200-SXM5-141GB"


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
    # The per-node count slots; per-domain: the last test switches the controller.
    pin = "--fabric-pool-shape=per-node"
    return (pin, f"--fabric-count-tenant={TENANT}", f"--fabric-machine-key={KEY}")


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


def model_cel(model: str) -> str:
    return f'device.attributes["patchbay.dev"].productName == "{model}"'


def model_request(model: str) -> dict[str, Any]:
    cel = model_cel(model)
    return {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.patchbay.dev",
            "selectors": [{"cel": {"expression": cel}}],
        },
    }


def test_claims_run_on_the_devices_the_manager_chose(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    env, ns, sim = machines, namespace, machines.nodes[0]
    node = sim.name
    before = scale_ups(env)
    tmpl = template(resource_api, ns, "h100", [model_request(H100)])
    pool = fabric_pool(resource_api)
    served: dict[str, str] = {}
    for name in ("one", "two"):
        pod(core, ns, name, node, tmpl)
        running(env, core, ns, name, timeout=150)
        claim = claim_of(core, resource_api, ns, name)
        (result,) = claim.status.allocation.devices.results
        assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
        slot = pool[result.device]  # a model slot: it names no device
        assert attr(slot, "productName") == H100 and "fabricDevice" not in slot.attributes
        (status,) = [d for d in claim.status.devices if d.device == result.device]
        device, uuid, serial = (status.data[k] for k in ("fabricDevice", "uuid", "serial"))
        # One scale-up for this allocation; the manager chose the device, and
        # the claim names what it chose.
        assert scale_ups(env)[len(before) + len(served) :] == [(device, f"{node}/adapter0")]
        assert env.fabric.connections()[device][:2] == (node, "adapter0")
        # The node saw the board serial the manager answered, and its plugin
        # prepared that GPU for the container.
        seen = wait_for(
            f"{node}'s report: {uuid} held prepared",
            lambda uuid=uuid: next(
                (r for r in [report(core, node)] if uuid in r.get("busy", [])), None
            ),
            timeout=30,
        )
        assert seen["serials"][serial] == uuid, seen
        assert visible(container_record(sim, ns, name)) == [uuid]
        served[name] = device
    assert sorted(served.values()) == ["gpu-0", "gpu-1"]  # each of sw0's H100s once
    # A third H100 on that switch is more than the manager can attach: the
    # counter keeps the scheduler from allocating it, and no scale-up is asked.
    pod(core, ns, "three", node, tmpl)
    wait_for(
        "the third pod's FailedScheduling",
        lambda: events_about(core, ns, "three", "FailedScheduling"),
        timeout=60,
    )
    assert len(scale_ups(env)) == len(before) + 2
    gone(core, ns, "three")  # before a slot frees: it would be allocated then
    gone(core, ns, "one")
    wait_for(f"{served['one']} scaled down", lambda: served["one"] not in env.fabric.connections(),
             timeout=60)  # fmt: skip
    assert served["two"] in env.fabric.connections()
    gone(core, ns, "two")
    wait_for("both scaled down", lambda: not env.fabric.connections(), timeout=60)
    assert len(scale_ups(env)) == len(before) + 2  # one per allocation, none again


def test_another_model_arriving_fails_the_claim_naming_it(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    env, ns, node = machines, namespace, machines.nodes[1].name
    before = scale_ups(env)
    env.fabric.request("POST", "/patchbay/v1/count-faults", {"wrongModelNext": 1})
    tmpl = template(resource_api, ns, "h200", [model_request(H200)])
    pod(core, ns, "wrong", node, tmpl)
    wait_for(
        "the pod's claim",
        lambda: core.read_namespaced_pod("wrong", ns).status.resource_claim_statuses,
        timeout=60,
    )
    claim = claim_of(core, resource_api, ns, "wrong")
    (warning, *_) = wait_for(
        "the AttachFailed event",
        lambda: events_about(core, ns, claim.metadata.name, "AttachFailed"),
        timeout=90,
    )
    assert warning.type == "Warning"
    assert f"asked one gpu of model {H200} for node {node}" in warning.message
    assert "gpu H100-SXM5-80GB serial" in warning.message, warning.message
    assert "arrived instead; scaled it down again" in warning.message
    # The H100 that arrived went back; the scheduler tries again and the next
    # scale-up brings the H200, which the pod runs with.
    running(env, core, ns, "wrong", timeout=150)
    claim = claim_of(core, resource_api, ns, "wrong")
    (status,) = [
        d for d in claim.status.devices if "FabricDeviceReady" in conditions(claim, d.device)
    ]
    assert status.data["fabricDevice"] == "gpu-2"
    assert [t for t, _ in scale_ups(env)[len(before) :]][-1] == "gpu-2"
    gone(core, ns, "wrong")
    wait_for("gpu-2 scaled down", lambda: not env.fabric.connections(), timeout=60)


def test_a_restart_after_the_answer_takes_up_the_device_that_arrived(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """Killed right after the manager's answer, before the claim names the
    device: the next incarnation takes it up (no scale-down, no second
    scale-up) and the pod runs on it."""
    env, ns, node = machines, namespace, machines.nodes[0].name
    before = scale_ups(env)
    restart(env, "crash-count", "fabric-attach-answered")
    try:
        tmpl = template(resource_api, ns, "h100", [model_request(H100)])
        pod(core, ns, "crash", node, tmpl)
        wait_for("the controller killed after the answer", lambda: not env.ctl.alive, timeout=120)
        assert "crash point fabric-attach-answered reached" in env.ctl.log_tail(200)
        ((device, via),) = scale_ups(env)[len(before) :]
        restart(env, "after-count-crash")
        running(env, core, ns, "crash", timeout=150)
        claim = claim_of(core, resource_api, ns, "crash")
        (result,) = claim.status.allocation.devices.results
        (status,) = [d for d in claim.status.devices if d.device == result.device]
        assert status.data["fabricDevice"] == device
        assert scale_ups(env)[len(before) :] == [(device, via)]  # asked once, never again
        assert env.fabric.connections()[device][:2] == (node, "adapter0")
        gone(core, ns, "crash")
        wait_for(f"{device} scaled down", lambda: device not in env.fabric.connections(),
                 timeout=60)  # fmt: skip
        assert len(scale_ups(env)) == len(before) + 1
    finally:
        if not env.ctl.alive or ENV in env.ctl.env:
            restart(env, "controller-0")


def test_a_pod_takes_a_spare_and_it_is_replaced(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """With a fixed spare per node (the cap allows one): the keeper asks for
    an H100 and keeps what arrived, published as that device's variant
    without binding conditions; a pod that asks for a spare runs on it with
    no scale-up of its own, and another H100 is attached as the next spare."""
    env, ns = machines, namespace
    plain = env.ctl.extra
    env.ctl.extra = (*plain, f"--spares-fixed=gpu:{H100}=1", "--spares-cap=0.5")
    restart(env, "controller-spares")
    try:

        def spares() -> dict[str, Any]:
            pool = fabric_pool(resource_api)
            return {n: d for n, d in pool.items() if d.attributes["spare"].bool}

        ((name, spare),) = wait_for("a spare published", lambda: list(spares().items()),
                                    timeout=90)  # fmt: skip
        device, node = attr(spare, "fabricDevice"), spare.node_name
        assert not spare.binding_conditions and attr(spare, "productName") == H100
        assert env.fabric.connections()[device][0] == node  # what the manager attached
        before = scale_ups(env)
        request = model_request(H100)
        cel = f'device.attributes["patchbay.dev"].spare && {model_cel(H100)}'
        request["exactly"]["selectors"] = [{"cel": {"expression": cel}}]
        pod(core, ns, "spare", node, template(resource_api, ns, "spare", [request]))
        running(env, core, ns, "spare", timeout=60)
        claim = claim_of(core, resource_api, ns, "spare")
        (result,) = claim.status.allocation.devices.results
        assert result.device == name and not result.binding_conditions
        (status,) = [d for d in claim.status.devices if d.device == name]
        assert status.data["fabricDevice"] == device
        # The replacement: the other H100, asked for once; none for the pod.
        (other,) = wait_for("the replacement spare", lambda: [
            d for n, d in spares().items() if n != name], timeout=90)  # fmt: skip
        assert [t for t, _ in scale_ups(env)[len(before) :]] == [attr(other, "fabricDevice")]
        gone(core, ns, "spare")
    finally:
        env.ctl.extra = plain
        restart(env, "controller-0")  # no spares wanted: they are scaled down
    wait_for("every spare scaled down", lambda: not env.fabric.connections(), timeout=90)


def test_per_domain_slots_are_published_once_and_asked_for_the_picked_node(
    machines: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """``--fabric-pool-shape=per-domain``: each slot once, in its reach
    domain's pool with no node (sw0's two H100s, sw1's H200), not once per
    node; a pod runs on what the manager chose with one scale-up through its
    node's adapter, and is scaled down on release. (Another model arriving
    is the dialect's check, the same in both shapes: the test above; what
    the per-domain slot does then: tests/unit/test_controller_domain_slots.py.)"""
    env, ns = machines, namespace
    plain = env.ctl.extra
    for name, labels in env.layout.reach_labels(env.nodes).items():
        core.patch_node(name, {"metadata": {"labels": labels}})
    shape = "--fabric-pool-shape="
    env.ctl.extra = (*(a for a in plain if not a.startswith(shape)), f"{shape}per-domain")
    restart(env, "controller-domain")
    try:

        def slots() -> list[tuple[str, str, Any]]:
            found = fabric_slices(resource_api)
            return sorted((s.spec.pool.name, attr(d, "productName"), d.node_name)
                          for s in found for d in s.spec.devices or ())  # fmt: skip

        want = [("fabric/pcie0.sw0", H100, None)] * 2 + [("fabric/pcie0.sw1", H200, None)]
        wait_for("each slot once, per domain", lambda: slots() == want, timeout=60)
        node = env.nodes[1].name
        before = scale_ups(env)
        pod(core, ns, "dom", node, template(resource_api, ns, "dom", [model_request(H100)]))
        running(env, core, ns, "dom", timeout=150)
        claim = claim_of(core, resource_api, ns, "dom")
        (result,) = claim.status.allocation.devices.results
        assert result.pool == "fabric/pcie0.sw0"
        (status,) = [d for d in claim.status.devices if d.device == result.device]
        device, uuid = status.data["fabricDevice"], status.data["uuid"]
        assert scale_ups(env)[len(before) :] == [(device, f"{node}/adapter0")]
        assert visible(container_record(env.nodes[1], ns, "dom")) == [uuid]
        gone(core, ns, "dom")
        wait_for(f"{device} scaled down", lambda: not env.fabric.connections(), timeout=60)
        assert len(scale_ups(env)) == len(before) + 1  # one per allocation, none again
    finally:
        env.ctl.extra = plain
        restart(env, "controller-0")
