"""Fabric devices on the real control plane: the pool, attach and release,
races, pairs (tests/e2e/conftest.py builds the environment), once per
attach dialect (``connections`` and ``zones``).

The real scheduler allocates fabric variants and waits in PreBind for
FabricDeviceReady; the node agents prepare through our plugins. Scenarios
follow issue 7. Pinned to ``--fabric-pool-shape=per-node`` (no longer the
default): its subject is the per-node variants (one per device, node and
adapter, each with its adapter's root, and pairs matched on that root); the
per-domain shape's counterparts are tests/e2e/test_fabric_domain_e2e.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from driver.fabric_devices.naming import FAILED_CONDITION, READY_CONDITION
from tests.e2e.fabric_helpers import (
    DIALECTS,
    ROOT,
    Env,
    attr,
    claim_gone_or_free,
    conditions,
    fabric_pool,
    fabric_slices,
    gpu_request,
    node_gpus,
    node_vfs,
    running,
    runs_with,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pods import claim_of, gone, phase, pod, refused

pytestmark = pytest.mark.cluster
FABRIC_DIALECTS = DIALECTS


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return ("--fabric-pool-shape=per-node",)  # the variants are the subject


def test_pool_has_one_variant_per_reachable_adapter(env: Env, resource_api: Any) -> None:
    pool = fabric_pool(resource_api)
    seen = {(attr(d, "fabricDevice"), d.node_name, attr(d, "fabricAdapter")) for d in pool.values()}
    names = [n.name for n in env.nodes]
    want = {(g, n, "adapter0") for g in ("gpu-0", "gpu-1") for n in names}
    assert seen == want | {(d, n, "adapter1") for d in ("gpu-2", "nic-0") for n in names}
    for d in pool.values():
        assert attr(d, ROOT) == (
            "pci0000:15" if attr(d, "fabricAdapter") == "adapter0" else "pci0000:85"
        )
        assert d.binding_conditions == [READY_CONDITION]
        assert d.binding_failure_conditions == [FAILED_CONDITION]
        assert d.binds_to_node is True
        assert len(d.consumes_counters) == 1
    for s in fabric_slices(resource_api):
        assert s.spec.per_device_node_selection is True
        assert s.spec.node_name is None and not s.spec.all_nodes
    counters = [c for s in fabric_slices(resource_api) for c in (s.spec.shared_counters or [])]
    assert sorted(k for c in counters for k in c.counters) == ["gpu-0", "gpu-1", "gpu-2", "nic-0"]
    assert {attr(d, "type") for d in pool.values() if attr(d, "fabricDevice") == "nic-0"} == {"vf"}
    for n in names:
        assert node_gpus(resource_api, n) == []


def test_fabric_gpu_attached_released_and_reused(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    tmpl = template(resource_api, ns, "g2", [gpu_request(fabric_device="gpu-2")])
    started = time.monotonic()
    pod(core, ns, "first", node, tmpl)
    running(env, core, ns, "first")
    claim = claim_of(core, resource_api, ns, "first")
    (result,) = claim.status.allocation.devices.results
    assert result.pool == "fabric"
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    # One scheduling cycle: the pod waited in PreBind, it was never rescheduled.
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=first").items
    assert [e.reason for e in events if e.reason == "FailedScheduling"] == []
    assert sum(e.reason == "Scheduled" for e in events) == 1
    assert env.fabric.connections()["gpu-2"][:2] == (node, "adapter1")
    # The attached GPU is never offered as a free local device.
    assert node_gpus(resource_api, node) == []
    print(f"fabric GPU allocation-to-Running: {time.monotonic() - started:.1f}s")

    # The claim's Events tell the story (kubectl describe resourceclaim).
    # (The recorder writes them from its own task, after the status the pod
    # waited for.)
    expected = [
        ("Attaching", f"attaching fabric device gpu-2 to node {node} via adapter1"),
        ("Attached", f"gpu-2 attached to {node} via adapter1"),
    ]
    wait_for(
        "the claim's Attaching and Attached Events",
        lambda: (
            [(e.reason, e.message) for e in events_about(core, ns, claim.metadata.name)] == expected
        ),
        timeout=30,
    )
    ev = events_about(core, ns, claim.metadata.name)[0]
    assert ev.reporting_component == "patchbay.dev/controller" and ev.type == "Normal"
    assert ev.involved_object.uid == claim.metadata.uid

    gone(core, ns, "first")
    wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)
    (detached,) = wait_for(
        "Detached Event",
        lambda: events_about(core, ns, claim.metadata.name, "Detached"),
        timeout=30,
    )
    assert detached.message == f"fabric device gpu-2 detached from node {node}"
    assert len(fabric_pool(resource_api)) == env.pool_size
    # The device is back: the next pod (on the other node) gets it.
    runs_with(env, core, ns, "second", tmpl, env.nodes[1].name, "gpu-2", "adapter1")


def test_two_pods_race_for_the_last_fabric_gpu(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns = namespace
    tmpl = template(resource_api, ns, "last", [gpu_request(fabric_device="gpu-2")])
    pod(core, ns, "race-a", None, tmpl)
    pod(core, ns, "race-b", None, tmpl)

    def one_running() -> str | None:
        env.check_alive()
        phases = {p: phase(core, ns, p) for p in ("race-a", "race-b")}
        assert list(phases.values()).count("Running") <= 1, phases
        return next((p for p, ph in phases.items() if ph == "Running"), None)

    winner = wait_for("one racer Running", one_running, timeout=120)
    loser = "race-b" if winner == "race-a" else "race-a"
    # The loser keeps waiting: the scheduler's own verdict that it does not fit
    # (fails at once if it binds the loser to a node instead).
    print(f"{loser}:", refused(core, ns, loser))
    assert one_running() == winner and phase(core, ns, loser) == "Pending"
    gone(core, ns, winner)
    running(env, core, ns, loser)
    gone(core, ns, loser)
    wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)


def test_pod_deleted_while_prebind_waits_is_detached_by_the_controller(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    # No kubelet ever prepares (so none unprepares) a pod that never got
    # bound: the controller alone must notice the allocation is gone.
    ns, node = namespace, env.nodes[0].name
    tmpl = template(resource_api, ns, "doomed", [gpu_request(fabric_device="gpu-1")])
    env.fabric.faults(attachLatencySeconds=10)
    try:
        pod(core, ns, "doomed", node, tmpl)

        def allocated() -> Any:
            env.check_alive()
            statuses = core.read_namespaced_pod("doomed", ns).status.resource_claim_statuses
            if not statuses or not statuses[0].resource_claim_name:
                return None
            claim = resource_api.read_namespaced_resource_claim(statuses[0].resource_claim_name, ns)
            if claim.status is None or claim.status.allocation is None:
                return None
            (result,) = claim.status.allocation.devices.results
            attaching = conditions(claim, result.device) == {"FabricDeviceReady": "False"}
            return claim if attaching and "gpu-1" in env.fabric.connections() else None

        # Not ready, PreBind still waits; the attach's operation handle is on the claim.
        claim = wait_for("gpu-1 allocated and attaching", allocated, timeout=60)
        (result,) = claim.status.allocation.devices.results
        assert result.pool == "fabric"
        (entry,) = [d for d in claim.status.devices if d.device == result.device]
        assert entry.data["fabricOperation"].startswith("/redfish/v1/TaskService/"), entry.data
        conn = env.fabric.connections()["gpu-1"]
        assert conn[:2] == (node, "adapter0") and conn[2] != "Attached", conn
        doomed = core.read_namespaced_pod("doomed", ns)
        assert doomed.spec.node_name is None and doomed.status.phase == "Pending"
        gone(core, ns, "doomed")
        wait_for(
            "the claim gone or deallocated",
            lambda: claim_gone_or_free(resource_api, ns, claim.metadata.name),
            timeout=60,
        )
        # The in-flight attach finishes (10 s) and must then be rolled back.
        # The latency stays until then: lowering it releases the attach at
        # once, and a pod created while the scheduler's binding cycle of the
        # deleted one still holds the device may wait for its next retry.
        wait_for(
            "gpu-1 detached",
            lambda: env.check_alive() and "gpu-1" not in env.fabric.connections(),
            timeout=60,
        )
    finally:
        env.fabric.faults(attachLatencySeconds=0.2)
    pool = fabric_pool(resource_api)
    assert len(pool) == env.pool_size
    names = {n.name for n in env.nodes}
    assert {d.node_name for d in pool.values() if attr(d, "fabricDevice") == "gpu-1"} == names
    # The device is free again: a new pod (on the other node) gets it.
    runs_with(env, core, ns, "after", tmpl, env.nodes[1].name, "gpu-1", "adapter0")


def test_gpu_and_vf_pair_through_the_adapter_on_the_vfs_root(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[1].name
    # The only free VFs this request accepts are the node's own (behind root 15).
    local = 'device.attributes["patchbay.dev"].attachment == "local"'
    vf = {
        "name": "nic",
        "exactly": {
            "deviceClassName": "vf.patchbay.dev",
            "selectors": [{"cel": {"expression": local}}],
        },
    }
    tmpl = template(
        resource_api, ns, "pair", [gpu_request(), vf],
        constraints=[{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
    )  # fmt: skip
    pod(core, ns, "pair", node, tmpl)
    running(env, core, ns, "pair")
    claim = claim_of(core, resource_api, ns, "pair")
    got = {r.request: (r.pool, r.device) for r in claim.status.allocation.devices.results}
    pool = fabric_pool(resource_api)
    gpu = pool[got["gpu"][1]]
    assert got["gpu"][0] == "fabric" and attr(gpu, "fabricAdapter") == "adapter0"
    local = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    vfs = {d.name: d for s in local for d in (s.spec.devices or [])}
    assert attr(vfs[got["nic"][1]], ROOT) == attr(gpu, ROOT) == "pci0000:15"
    assert env.fabric.connections()[attr(gpu, "fabricDevice")][:2] == (node, "adapter0")
    gone(core, ns, "pair")
    wait_for("pair's GPU detached", lambda: not env.fabric.connections(), timeout=60)


def test_gpu_and_vf_both_from_the_fabric_through_one_adapter(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    # gpu-2 sits behind adapter1 (root 85) only; the node's own VFs are on
    # root 15: the pair can only hold with the fabric NIC attached beside it.
    ns, node = namespace, env.nodes[0].name
    vf = {"name": "nic", "exactly": {"deviceClassName": "vf.patchbay.dev"}}
    tmpl = template(
        resource_api, ns, "fabpair", [gpu_request(fabric_device="gpu-2"), vf],
        constraints=[{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
    )  # fmt: skip
    local_before = node_vfs(resource_api, node)
    pod(core, ns, "fabpair", node, tmpl)
    running(env, core, ns, "fabpair")
    claim = claim_of(core, resource_api, ns, "fabpair")
    got = {r.request: (r.pool, r.device) for r in claim.status.allocation.devices.results}
    pool = fabric_pool(resource_api)
    assert got["gpu"][0] == got["nic"][0] == "fabric"
    nic = pool[got["nic"][1]]
    assert attr(nic, "fabricDevice") == "nic-0" and attr(nic, ROOT) == "pci0000:85"
    conns = env.fabric.connections()
    assert conns["gpu-2"][:2] == conns["nic-0"][:2] == (node, "adapter1")
    for _, device in got.values():
        assert conditions(claim, device) == {"FabricDeviceReady": "True"}
    # The attached NIC's VFs are never offered as free local VFs.
    assert node_vfs(resource_api, node) == local_before
    gone(core, ns, "fabpair")
    wait_for("both detached", lambda: not env.fabric.connections(), timeout=60)
    assert len(fabric_pool(resource_api)) == env.pool_size


def test_a_device_turning_critical_leaves_the_pool_on_the_fabric_event(
    env: Env, resource_api: Any
) -> None:
    # The controller polls the fabric every 300 s here: only the fabric's
    # event stream can make it see the fault within the wait below.
    def ids() -> set[str]:
        return {attr(d, "fabricDevice") for d in fabric_pool(resource_api).values()}

    env.fabric.faults(devices={"gpu-1": {"health": "Critical"}})
    try:
        wait_for("gpu-1 out of the pool", lambda: "gpu-1" not in ids(), timeout=20)
        assert ids() == {"gpu-0", "gpu-2", "nic-0"}
    finally:
        env.fabric.faults(devices={"gpu-1": {"health": "OK"}})
    wait_for(
        "gpu-1 back in the pool",
        lambda: len(fabric_pool(resource_api)) == env.pool_size,
        timeout=20,
    )


def test_an_adapter_the_node_loses_is_a_warning_on_the_node(  # keep last: the adapter stays gone
    env: Env, resource_api: Any, core: Any
) -> None:
    sim = env.nodes[1]
    sim.host.hot_remove(str(sim.host.adapters["adapter1"][0]))  # the adapter's port goes away

    def adapter_gone() -> list[Any]:
        return events_about(core, "default", sim.name, "FabricAdapterGone")

    (ev,) = wait_for("FabricAdapterGone on the Node", adapter_gone, timeout=60)
    node = core.read_node(sim.name)
    assert (ev.type, ev.involved_object.kind) == ("Warning", "Node")
    assert ev.involved_object.uid == node.metadata.uid
    assert "adapter1 (pci0000:85)" in ev.message, ev.message

    def offered() -> set[str]:
        pool = fabric_pool(resource_api).values()
        return {attr(d, "fabricAdapter") for d in pool if d.node_name == sim.name}

    wait_for("the node's adapter1 variants withdrawn", lambda: offered() == {"adapter0"})
