"""Fabric recovery on the real control plane: controller and fabric crashes,
injected attach failures, devices held by unprepared claims or still in use,
leader handover (tests/e2e/conftest.py builds the environment; scenarios
follow issues 7 and 34).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client, watch

from fabric.simhost import violations
from tests.e2e.fabric_helpers import (
    HOLD_S,
    LEASE_S,
    Env,
    attr,
    claim_gone_or_free,
    conditions,
    detached,
    fabric_pool,
    fabric_slices,
    gpu_request,
    kept_attached,
    pod_attaching,
    running,
    running_on_device,
    template,
)
from tests.e2e.helpers import events_about, unique, wait_for
from tests.e2e.pods import claim_of, gone, pod
from tests.harness.cluster_proc import free_port
from tests.harness.fabricsim import ControllerProcess

pytestmark = pytest.mark.cluster


def test_controller_killed_mid_attach_and_fabric_restarted(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    pod_attaching(env, resource_api, core, ns, "slow", "gpu-0", node, latency=4)
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
    gone(core, ns, "slow")
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)


def test_pod_deleted_while_the_controller_is_down_mid_attach_is_rolled_back(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    # The other half of "finishes or rolls back": the allocation disappears
    # while no controller runs and the fabric restarts with the attach in
    # flight; the next incarnation must detach what nobody needs.
    ns, node = namespace, env.nodes[1].name
    pod_attaching(env, resource_api, core, ns, "orphan", "gpu-1", node, latency=15)
    claim = claim_of(core, resource_api, ns, "orphan").metadata.name
    env.ctl.kill()
    gone(core, ns, "orphan")
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
        lambda: len(fabric_pool(resource_api)) == env.pool_size,
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
    pod(core, ns, "retry", node, tmpl)
    running(env, core, ns, "retry", timeout=150)
    left = gpu_ids()
    (failed,) = ids - left  # the failed device is out of the pool during its hold
    claim = claim_of(core, resource_api, ns, "retry")
    (result,) = claim.status.allocation.devices.results
    got = attr(fabric_pool(resource_api)[result.device], "fabricDevice")
    assert got != failed
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    assert set(env.fabric.connections()) == {got}

    # The failure is a Warning on the claim with the fabric's own message.
    # Events are written by the recorder's own task, after the status the
    # pod waited for: wait for the whole sequence.
    def reasons() -> list[str]:
        return [e.reason for e in events_about(core, ns, claim.metadata.name)]

    wait_for("the claim's Attached Event", lambda: "Attached" in reasons(), timeout=30)
    seen = [(e.reason, e.message) for e in events_about(core, ns, claim.metadata.name)]
    # Exactly one failure: the pool without the failed device is stored before
    # the failure is written (the scheduler cannot pick it again), and a pass
    # on a cache without that write does not ask again.
    assert reasons() == ["Attaching", "AttachFailed", "Attaching", "Attached"], seen
    (warning,) = events_about(core, ns, claim.metadata.name, "AttachFailed")
    assert warning.type == "Warning"
    assert warning.message.startswith(f"attaching {failed} to {node} via adapter")
    assert f"injected failure: attach of {failed} to {node} failed" in warning.message
    gone(core, ns, "retry")
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)
    wait_for(
        f"{failed} back after its hold",
        lambda: len(fabric_pool(resource_api)) == env.pool_size,
        timeout=HOLD_S + 30,
    )


def test_a_released_device_stays_attached_until_its_node_unprepared_it(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    # A force-deleted pod releases its claim at once, before the kubelet has
    # unprepared it: the controller must not pull the GPU from under the
    # container. With the plugin down nothing can unprepare it.
    ns, node = namespace, env.nodes[0]
    running_on_device(env, resource_api, core, ns, "held", "gpu-0", node.name)
    claim = claim_of(core, resource_api, ns, "held").metadata.name
    node.plugin.kill()
    start = env.ctl.log_path.stat().st_size  # this pass's lines come after
    try:
        core.delete_namespaced_pod("held", ns, grace_period_seconds=0)
        wait_for(
            "the claim released",
            lambda: claim_gone_or_free(resource_api, ns, claim),
            timeout=60,
        )

        kept_attached(env, "gpu-0", node.name, start, "still prepared")
        assert "gpu-0" in env.fabric.connections(), "detached while still prepared"
    finally:
        node.plugin.start()
    detached(env, "gpu-0", "unprepared", timeout=90)


def test_a_released_gpu_a_process_still_uses_is_detached_only_once_it_ends(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    # Issue 34: the controller detached a GPU pods still ran on once the claim
    # that attached it was released; a real host removes it all the same (XID
    # 79), so the simulated host records such a remove and the test fails on it.
    ns, node = namespace, env.nodes[0]
    running_on_device(env, resource_api, core, ns, "inuse", "gpu-1", node.name)
    uuid = next(
        attr(d, "uuid") for d in fabric_pool(resource_api).values()
        if attr(d, "fabricDevice") == "gpu-1" and d.node_name in (node.name, None)
    )  # fmt: skip
    node.host.nvml.set_processes(uuid, [4242])  # outlives the pod, as a stuck process does
    start = env.ctl.log_path.stat().st_size  # this pass's lines come after
    gone(core, ns, "inuse")  # unprepared: no claim holds gpu-1 any more
    kept_attached(env, "gpu-1", node.name, start, "a process used it")
    node.host.nvml.set_processes(uuid, [])
    detached(env, "gpu-1", "its process ended", timeout=60)
    assert violations.read(node.host.dir) == []


def lease_holder(api_client: Any) -> tuple[str | None, Any]:
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
        "patchbay-controller", "default"
    )
    return lease.spec.holder_identity, lease.spec.renew_time


RENEWALS = 4  # a renewal every RETRY_PERIOD_S (2 s): 4 of them span more than LEASE_S


def lease_renewals(api_client: Any, holder: str | None, count: int, timeout: float) -> Any:
    """Watch the controller Lease until ``holder`` has renewed it ``count``
    times; fail at once if anyone else holds it. The last renewTime."""
    leases = client.CoordinationV1Api(api_client)
    query = {"field_selector": "metadata.name=patchbay-controller"}
    listing = leases.list_namespaced_lease("default", **query)
    seen = {item.spec.renew_time for item in listing.items}
    stream = watch.Watch()
    for event in stream.stream(
        leases.list_namespaced_lease, "default", resource_version=listing.metadata.resource_version,
        timeout_seconds=int(timeout), _request_timeout=timeout + 30, **query,
    ):  # fmt: skip
        spec = event["object"].spec
        if event["type"] == "BOOKMARK":
            continue
        if event["type"] == "DELETED" or spec.holder_identity != holder:
            stream.stop()
            pytest.fail(f"lease {event['type']}: holder {spec.holder_identity!r}, not {holder!r}")
        seen.add(spec.renew_time)
        if len(seen) > count:
            stream.stop()
            return spec.renew_time
    pytest.fail(f"{holder} renewed the lease {len(seen) - 1} times in {timeout:.0f}s, not {count}")


def test_two_replicas_one_leader_and_standby_takes_over(  # keep last: it replaces env.ctl
    env: Env, resource_api: Any, core: Any, namespace: str, api_client: Any
) -> None:
    ns, leader = namespace, env.ctl
    wait_for("a lease holder", lambda: lease_holder(api_client)[0], timeout=30)
    first, renewed = lease_holder(api_client)
    assert first != "controller-standby"
    before = {s.metadata.name: s.metadata.resource_version for s in fabric_slices(resource_api)}
    log = leader.log_path.with_name(f"{unique('controller-standby')}.log")
    # Its own /metrics port: two replicas of one pod template would each have their pod's.
    extra = [a for a in leader.extra if not a.startswith("--metrics-port=")]
    extra.append(f"--metrics-port={free_port()}")
    standby = ControllerProcess(leader.kubeconfig, env.fabric, log, *extra)
    standby.start(identity="controller-standby")
    try:
        wait_for(
            "the standby waiting for the lease",
            lambda: standby.alive and "waiting for leader lease" in standby.log_tail(200),
            timeout=30,
        )
        # The leader keeps renewing and the standby keeps off, over renewals
        # that span more than one lease duration (fails at a change of holder).
        assert lease_renewals(api_client, first, RENEWALS, timeout=LEASE_S * 5) > renewed
        assert standby.alive and leader.alive
        assert "acquired" not in standby.log_tail(200)
        after = {s.metadata.name: s.metadata.resource_version for s in fabric_slices(resource_api)}
        assert after == before  # nobody rewrote the pool
        assert len(fabric_pool(resource_api)) == env.pool_size

        leader.kill()
        killed = time.monotonic()
        env.ctl = standby  # from now on the live controller (and the one teardown stops)
        wait_for(
            "the standby holding the lease",
            lambda: lease_holder(api_client)[0] == "controller-standby",
            timeout=LEASE_S * 3,
            interval=0.2,
        )
        # A figure, not an assertion (expect about the lease duration plus one poll).
        print(f"standby took over {time.monotonic() - killed:.1f}s after the leader died")
        assert "leader lease default/patchbay-controller acquired by controller-standby" in (
            standby.log_tail(200)
        )
        running_on_device(env, resource_api, core, ns, "ha", "gpu-2", env.nodes[0].name)
        claim = claim_of(core, resource_api, ns, "ha")
        (result,) = claim.status.allocation.devices.results
        assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
        gone(core, ns, "ha")
        wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)
    finally:
        if env.ctl is not standby:
            standby.stop()
