"""Fabric GPUs on the real control plane: controller, simulated fabric, nodes.

Two GPU-less simulated nodes (``fabric-adapters``: a NIC PF with 4 VFs on
root pci0000:15, adapter0 on pci0000:15, adapter1 on pci0000:85), a real
``patchbay-fabric`` (switch sw0: gpu-0, gpu-1 wired to adapter0 of both
nodes; sw1: gpu-2 and the ConnectX NIC nic-0 wired to adapter1 of both) and a real
``patchbay-controller`` running with its own identity, bound to
hack/rbac/controller.yaml. The real scheduler allocates fabric variants and
waits in PreBind for FabricDeviceReady; the node agents prepare through our
plugins. Scenarios follow issue 7.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from kubernetes import client
from kubernetes.client.rest import ApiException
from simnode import SimNode, apply_rbac, build_nvml_mock

from tests.e2e.fabric_helpers import (
    Env,
    attr,
    claim_gone_or_free,
    claim_of,
    conditions,
    delete_pod,
    fabric_pool,
    fabric_slices,
    gpu_request,
    make_pod,
    node_gpus,
    node_vfs,
    phase,
    running,
    template,
)
from tests.e2e.helpers import delete_quietly, unique, wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
ROOT = "resource.kubernetes.io/pcieRoot"
ADAPTERS = "--fabric-adapters=adapter0=0000:15:02.0,adapter1=0000:85:01.0"
HOLD_S = 45
POOL_SIZE = 8  # gpu-0, gpu-1, gpu-2 and nic-0, each reachable from both nodes
LEASE_S = 6  # short leader lease: a standby takes over within seconds


@pytest.fixture(scope="module")
def env(local_cluster, resource_api, core, tmp_path_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    build_nvml_mock()
    apply_rbac(local_cluster.kubeconfig, "plugin.yaml")
    apply_rbac(local_cluster.kubeconfig, "controller.yaml")
    for path in sorted((REPO / "deviceclasses").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "DeviceClass":
                with contextlib.suppress(ApiException):
                    resource_api.create_device_class(doc)
    vf_config = tmp_path_factory.mktemp("vf") / "vf.yaml"
    vf_config.write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
    plugin_kc = local_cluster.kubeconfig_for(
        "patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",)
    )
    names = [unique("fab"), unique("fab")]
    nodes = [
        SimNode(
            local_cluster, n, "fabric-adapters", plugin_kc, (ADAPTERS, f"--vf-config={vf_config}")
        )
        for n in names
    ]
    spec = {
        "switches": [
            switch("sw0", [(n.name, "adapter0", n.host.dir) for n in nodes], ["gpu-0", "gpu-1"]),
            switch("sw1", [(n.name, "adapter1", n.host.dir) for n in nodes], ["gpu-2"], ["nic-0"]),
        ]
    }
    run = Path(local_cluster.run_dir)
    fabric = FabricService(run / "fabric", spec)
    ctl_kc = local_cluster.kubeconfig_for(
        "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
    )
    ctl = ControllerProcess(
        ctl_kc,
        fabric,
        run / "logs" / "controller.log",
        f"--failed-device-hold={HOLD_S}",
        f"--lease-duration={LEASE_S}",
    )
    e = Env(nodes, fabric, ctl)
    try:
        for n in nodes:
            n.start()
        fabric.start()
        ctl.start()
        wait_for(
            f"{POOL_SIZE} fabric variants published",
            lambda: e.check_alive() and len(fabric_pool(resource_api)) == POOL_SIZE,
            timeout=90,
        )
        yield e
    finally:
        ctl.stop()
        fabric.stop()
        for n in nodes:
            n.stop()
            delete_quietly(core.delete_node, n.name)


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
        assert d.binding_conditions == ["FabricDeviceReady"]
        assert d.binding_failure_conditions == ["FabricAttachFailed"]
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
    make_pod(core, ns, "first", tmpl, node)
    running(env, core, ns, "first")
    claim = claim_of(core, resource_api, ns, "first")
    (result,) = claim.status.allocation.devices.results
    assert result.pool == "fabric"
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    assert env.fabric.connections()["gpu-2"][:2] == (node, "adapter1")
    # The attached GPU is never offered as a free local device.
    assert node_gpus(resource_api, node) == []
    print(f"fabric GPU allocation-to-Running: {time.monotonic() - started:.1f}s")

    delete_pod(core, ns, "first")
    wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)
    assert len(fabric_pool(resource_api)) == POOL_SIZE
    # The device is back: the next pod (on the other node) gets it.
    other = env.nodes[1].name
    make_pod(core, ns, "second", tmpl, other)
    running(env, core, ns, "second")
    assert env.fabric.connections()["gpu-2"][:2] == (other, "adapter1")
    delete_pod(core, ns, "second")
    wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)


def test_two_pods_race_for_the_last_fabric_gpu(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns = namespace
    tmpl = template(resource_api, ns, "last", [gpu_request(fabric_device="gpu-2")])
    make_pod(core, ns, "race-a", tmpl)
    make_pod(core, ns, "race-b", tmpl)

    def one_running() -> str | None:
        env.check_alive()
        phases = {p: phase(core, ns, p) for p in ("race-a", "race-b")}
        assert list(phases.values()).count("Running") <= 1, phases
        return next((p for p, ph in phases.items() if ph == "Running"), None)

    winner = wait_for("one racer Running", one_running, timeout=120)
    loser = "race-b" if winner == "race-a" else "race-a"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the loser keeps waiting, never both
        one_running()
        time.sleep(0.5)
    assert phase(core, ns, loser) == "Pending"
    delete_pod(core, ns, winner)
    running(env, core, ns, loser)
    delete_pod(core, ns, loser)
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
        make_pod(core, ns, "doomed", tmpl, node)

        def allocated() -> Any:
            env.check_alive()
            statuses = core.read_namespaced_pod("doomed", ns).status.resource_claim_statuses
            if not statuses or not statuses[0].resource_claim_name:
                return None
            claim = resource_api.read_namespaced_resource_claim(statuses[0].resource_claim_name, ns)
            if claim.status is None or claim.status.allocation is None:
                return None
            return claim if "gpu-1" in env.fabric.connections() else None

        claim = wait_for("gpu-1 allocated and attaching", allocated, timeout=60)
        (result,) = claim.status.allocation.devices.results
        assert result.pool == "fabric"
        assert conditions(claim, result.device) == {}  # not ready: PreBind still waits
        conn = env.fabric.connections()["gpu-1"]
        assert conn[:2] == (node, "adapter0") and conn[2] != "Attached", conn
        pod = core.read_namespaced_pod("doomed", ns)
        assert pod.spec.node_name is None and pod.status.phase == "Pending"
        delete_pod(core, ns, "doomed")
        wait_for(
            "the claim gone or deallocated",
            lambda: claim_gone_or_free(resource_api, ns, claim.metadata.name),
            timeout=60,
        )
    finally:
        env.fabric.faults(attachLatencySeconds=0.2)
    # The in-flight attach finishes (10 s) and must then be rolled back.
    wait_for(
        "gpu-1 detached", lambda: env.check_alive() and "gpu-1" not in env.fabric.connections(),
        timeout=60,
    )  # fmt: skip
    pool = fabric_pool(resource_api)
    assert len(pool) == POOL_SIZE
    names = {n.name for n in env.nodes}
    assert {d.node_name for d in pool.values() if attr(d, "fabricDevice") == "gpu-1"} == names
    # The device is free again: a new pod (on the other node) gets it.
    other = env.nodes[1].name
    make_pod(core, ns, "after", tmpl, other)
    running(env, core, ns, "after")
    assert env.fabric.connections()["gpu-1"][:2] == (other, "adapter0")
    delete_pod(core, ns, "after")
    wait_for("gpu-1 detached", lambda: "gpu-1" not in env.fabric.connections(), timeout=60)


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
    make_pod(core, ns, "pair", tmpl, node)
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
    delete_pod(core, ns, "pair")
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
    make_pod(core, ns, "fabpair", tmpl, node)
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
    delete_pod(core, ns, "fabpair")
    wait_for("both detached", lambda: not env.fabric.connections(), timeout=60)
    assert len(fabric_pool(resource_api)) == POOL_SIZE


def test_controller_killed_mid_attach_and_fabric_restarted(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    env.fabric.faults(attachLatencySeconds=4)
    tmpl = template(resource_api, ns, "slow", [gpu_request(fabric_device="gpu-0")])
    make_pod(core, ns, "slow", tmpl, node)
    wait_for("gpu-0 attaching", lambda: "gpu-0" in env.fabric.connections(), timeout=60)
    env.ctl.kill()
    env.fabric.kill()
    env.fabric.start()
    env.ctl.start(identity="controller-1")
    running(env, core, ns, "slow", timeout=150)
    claim = claim_of(core, resource_api, ns, "slow")
    (result,) = claim.status.allocation.devices.results
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    assert set(env.fabric.connections()) == {"gpu-0"}  # nothing a claim does not need
    env.fabric.faults(attachLatencySeconds=0.2)
    delete_pod(core, ns, "slow")
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)


def test_pod_deleted_while_the_controller_is_down_mid_attach_is_rolled_back(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    # The other half of "finishes or rolls back": the allocation disappears
    # while no controller runs and the fabric restarts with the attach in
    # flight; the next incarnation must detach what nobody needs.
    ns, node = namespace, env.nodes[1].name
    env.fabric.faults(attachLatencySeconds=15)
    tmpl = template(resource_api, ns, "orphan", [gpu_request(fabric_device="gpu-1")])
    make_pod(core, ns, "orphan", tmpl, node)
    wait_for("gpu-1 attaching", lambda: "gpu-1" in env.fabric.connections(), timeout=60)
    claim = claim_of(core, resource_api, ns, "orphan").metadata.name
    env.ctl.kill()
    delete_pod(core, ns, "orphan")
    wait_for(
        "the claim gone or deallocated",
        lambda: claim_gone_or_free(resource_api, ns, claim),
        timeout=60,
    )
    env.fabric.kill()
    env.fabric.start()
    env.fabric.faults(attachLatencySeconds=0.2)
    env.ctl.start(identity="controller-2")
    wait_for(
        "gpu-1 rolled back", lambda: env.check_alive() and not env.fabric.connections(),
        timeout=90,
    )  # fmt: skip
    wait_for(
        "gpu-1 offered again on both nodes",
        lambda: len(fabric_pool(resource_api)) == POOL_SIZE,
        timeout=30,
    )


def test_injected_attach_failure_reschedules_on_another_device(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name

    def gpu_ids() -> set[str]:
        pool = fabric_pool(resource_api).values()
        return {attr(d, "fabricDevice") for d in pool if attr(d, "type") == "gpu"}

    ids = gpu_ids()
    assert ids == {"gpu-0", "gpu-1", "gpu-2"}
    env.fabric.faults(failNextAttaches=1)
    tmpl = template(resource_api, ns, "any", [gpu_request()])
    make_pod(core, ns, "retry", tmpl, node)
    running(env, core, ns, "retry", timeout=150)
    left = gpu_ids()
    (failed,) = ids - left  # the failed device is out of the pool during its hold
    claim = claim_of(core, resource_api, ns, "retry")
    (result,) = claim.status.allocation.devices.results
    got = attr(fabric_pool(resource_api)[result.device], "fabricDevice")
    assert got != failed
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    assert set(env.fabric.connections()) == {got}
    delete_pod(core, ns, "retry")
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)
    wait_for(
        f"{failed} back after its hold",
        lambda: len(fabric_pool(resource_api)) == POOL_SIZE,
        timeout=HOLD_S + 30,
    )


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
        "gpu-1 back in the pool", lambda: len(fabric_pool(resource_api)) == POOL_SIZE, timeout=20
    )


def lease_holder(api_client: Any) -> tuple[str | None, Any]:
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
        "patchbay-controller", "default"
    )
    return lease.spec.holder_identity, lease.spec.renew_time


def test_two_replicas_one_leader_and_standby_takes_over(  # keep last: it replaces env.ctl
    env: Env, resource_api: Any, core: Any, namespace: str, api_client: Any
) -> None:
    ns, leader = namespace, env.ctl
    wait_for("a lease holder", lambda: lease_holder(api_client)[0], timeout=30)
    first, renewed = lease_holder(api_client)
    assert first != "controller-standby"
    before = {s.metadata.name: s.metadata.resource_version for s in fabric_slices(resource_api)}
    log = leader.log_path.with_name(f"{unique('controller-standby')}.log")
    standby = ControllerProcess(leader.kubeconfig, env.fabric, log, *leader.extra)
    standby.start(identity="controller-standby")
    try:
        wait_for(
            "the standby waiting for the lease",
            lambda: standby.alive and "waiting for leader lease" in standby.log_tail(200),
            timeout=30,
        )
        time.sleep(LEASE_S * 1.5)  # several renewals of the leader, polls of the standby
        assert standby.alive and leader.alive
        holder, renewed_again = lease_holder(api_client)
        assert holder == first and renewed_again != renewed  # the leader keeps renewing
        assert "acquired" not in standby.log_tail(200)
        after = {s.metadata.name: s.metadata.resource_version for s in fabric_slices(resource_api)}
        assert after == before  # nobody rewrote the pool
        assert len(fabric_pool(resource_api)) == POOL_SIZE

        leader.kill()
        killed = time.monotonic()
        env.ctl = standby  # from now on the live controller (and the one teardown stops)
        wait_for(
            "the standby holding the lease",
            lambda: lease_holder(api_client)[0] == "controller-standby",
            timeout=LEASE_S * 3,
            interval=0.2,
        )
        took = time.monotonic() - killed
        print(f"standby took over {took:.1f}s after the leader died")
        assert took <= LEASE_S + LEASE_S / 3 + 4  # expiry + one standby poll + slack
        tmpl = template(resource_api, ns, "ha", [gpu_request(fabric_device="gpu-2")])
        make_pod(core, ns, "ha", tmpl, env.nodes[0].name)
        running(env, core, ns, "ha")
        claim = claim_of(core, resource_api, ns, "ha")
        (result,) = claim.status.allocation.devices.results
        assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
        delete_pod(core, ns, "ha")
        wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)
    finally:
        if env.ctl is not standby:
            standby.stop()
