"""Partial failure, named (issue 35), on the real control plane, in both
attach dialects: the shared fabric environment of tests/e2e/conftest.py
(gpu-0 and gpu-1 behind sw0, gpu-2 and nic-0 behind sw1, two nodes).

- One broken Endpoint (the simulated fabric's ``brokenEndpoint``: its GET
  answers 500): every other device is still offered and attaches; the
  doubtful device is held back, not unpublished; the breakage is told on the
  controller's leader Lease before any claim meets it (a
  ``FabricResourceBroken`` Event naming the URI, the 500 and the device it
  holds back, once however many reads see it); a claim that waits for it
  gets a ``FabricResourceBroken`` Event naming the URI and no failure; a
  running claim whose device turns doubtful keeps it (nothing detached)
  and is told; once the fault is lifted the waiting claim's attach goes on.
- An attach refused with 400 (``refuseAttach``): the device is held out of
  the pool with a ``FabricAttachRefused`` Event naming the request; the
  claim gets the next device it allows and other claims succeed.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.fabric_helpers import (
    DIALECTS,
    Env,
    attr,
    conditions,
    fabric_pool,
    first_available,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pods import claim_of, gone, pod

pytestmark = pytest.mark.cluster
FABRIC_DIALECTS = DIALECTS
ENDPOINTS = "/redfish/v1/Fabrics/pcie0/Endpoints"
BROKEN = "FabricResourceBroken"
REFUSED = "FabricAttachRefused"
# The controller's leader Lease (tests/harness/fabricsim.py starts it in "default").
LEASE_NS, LEASE = "default", "patchbay-controller"


def connected(env: Env) -> set[str]:
    """The devices the fabric connects, read raw from its Connections collection
    (the client's view holds back a device whose Endpoint is broken)."""
    body = env.fabric.request("GET", "/redfish/v1/Fabrics/pcie0/Connections?$expand=.")
    return {m["Links"]["TargetEndpoints"][0]["@odata.id"].rsplit("/", 1)[1]
            for m in body["Members"]}  # fmt: skip


def pool_devices(resource_api: Any) -> set[str]:
    """The fabric devices the pool offers (each on some node)."""
    return {attr(d, "fabricDevice") for d in fabric_pool(resource_api).values()}


def told(core: Any, ns: str, claim: str, reason: str, *words: str) -> Any:
    """Wait for the claim's Event of ``reason`` whose note holds every one of ``words``."""

    def found() -> Any:
        return next(
            (
                e
                for e in events_about(core, ns, claim, reason)
                if all(w in e.message for w in words)
            ),
            None,
        )

    event = wait_for(f"a {reason} Event on {claim} naming {words}", found, timeout=60)
    print(f"{reason}: {event.message}")
    return event


def on_lease(core: Any, since: dt.datetime, *words: str) -> Any:
    """Wait for the controller's ``FabricResourceBroken`` Event on its leader
    Lease, last seen at or after ``since``, whose note holds every one of ``words``."""

    def last(e: Any) -> dt.datetime:
        seen: list[dt.datetime] = [e.event_time, e.series and e.series.last_observed_time]
        return max(t for t in seen if t)

    def found() -> Any:
        return next((e for e in events_about(core, LEASE_NS, LEASE, BROKEN)
                     if last(e) >= since and all(w in e.message for w in words)), None)  # fmt: skip

    event = wait_for(f"a {BROKEN} Event on the Lease naming {words}", found, timeout=60)
    print(f"{BROKEN} on the Lease: {event.message}")
    return event


def test_a_broken_endpoint_holds_back_only_its_device(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    pod(core, ns, "kept", node, template(resource_api, ns, "kept", [gpu_request(
        fabric_device="gpu-0")]))  # fmt: skip
    running(env, core, ns, "kept")
    kept = claim_of(core, resource_api, ns, "kept")
    (held,) = kept.status.allocation.devices.results  # gpu-0's variant, allocated
    pool = fabric_pool(resource_api)
    offered = {held.device} | {n for n, d in pool.items() if attr(d, "fabricDevice") == "gpu-1"}
    assert len(offered) == (2 if env.per_domain else 3)  # gpu-1 once, or on both nodes
    since = dt.datetime.now(dt.UTC).replace(microsecond=0)  # Event times: whole seconds or finer
    env.fabric.faults(
        devices={"gpu-0": {"brokenEndpoint": True}, "gpu-1": {"brokenEndpoint": True}}
    )
    try:
        # gpu-0, attached and in use, turns doubtful: kept, and its claim told.
        told(core, ns, kept.metadata.name, BROKEN, "gpu-0", f"{ENDPOINTS}/gpu-0", "HTTP 500")
        assert "gpu-0" in connected(env)
        # Told on the Lease before any claim meets gpu-1: its URI, the 500, what it holds back.
        told_once = on_lease(core, since, f"fabric resource {ENDPOINTS}/gpu-1 is broken",
                             f"GET {ENDPOINTS}/gpu-1", "HTTP 500", "holds back gpu-1")  # fmt: skip
        lease = client.CoordinationV1Api(core.api_client).read_namespaced_lease(LEASE, LEASE_NS)
        assert told_once.type == "Warning"
        assert told_once.involved_object.kind == "Lease"
        assert told_once.involved_object.uid == lease.metadata.uid  # kubectl describe lease
        # The rest of the fabric (gpu-2 on the other switch) is offered and attaches.
        pod(core, ns, "other", node, template(resource_api, ns, "other", [gpu_request(
            fabric_device="gpu-2")]))  # fmt: skip
        running(env, core, ns, "other")
        # gpu-1 is in doubt: still offered; a claim for it waits, told why.
        assert "gpu-1" in pool_devices(resource_api)
        pod(core, ns, "doubt", node, template(resource_api, ns, "doubt", [gpu_request(
            fabric_device="gpu-1")]))  # fmt: skip
        wait_for("the doubt pod's claim", lambda: core.read_namespaced_pod(
            "doubt", ns).status.resource_claim_statuses, timeout=60)  # fmt: skip
        claim = claim_of(core, resource_api, ns, "doubt")
        told(core, ns, claim.metadata.name, BROKEN, "gpu-1", f"GET {ENDPOINTS}/gpu-1", "500")
        claim = claim_of(core, resource_api, ns, "doubt")
        (result,) = claim.status.allocation.devices.results
        assert conditions(claim, result.device) == {}, "a broken endpoint failed the claim"
        assert events_about(core, ns, claim.metadata.name, "AttachFailed") == []
        assert connected(env) == {"gpu-0", "gpu-2"}  # gpu-1 waits; gpu-0 not detached
        # Nothing unpublished for the partial reads.
        assert offered <= set(fabric_pool(resource_api))
        # Read again and again with gpu-1's Endpoint broken: still one occurrence.
        again = on_lease(core, since, f"fabric resource {ENDPOINTS}/gpu-1 is broken")
        assert again.metadata.uid == told_once.metadata.uid
        assert (again.series.count if again.series else 1) == (
            told_once.series.count if told_once.series else 1
        ), "told once per read, not once per breakage"
    finally:
        env.fabric.faults(
            devices={"gpu-0": {"brokenEndpoint": False}, "gpu-1": {"brokenEndpoint": False}}
        )
    running(env, core, ns, "doubt")  # the fault lifted: the attach it waited for goes on
    claim = claim_of(core, resource_api, ns, "doubt")
    (result,) = claim.status.allocation.devices.results
    assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
    assert set(env.fabric.connections()) == {"gpu-0", "gpu-1", "gpu-2"}
    gone(core, ns, "kept", "other", "doubt")
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)
    wait_for("pool whole", lambda: len(fabric_pool(resource_api)) == env.pool_size, timeout=60)


def test_a_refused_attach_holds_the_device_and_other_claims_succeed(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[1].name
    env.fabric.faults(devices={"gpu-1": {"refuseAttach": True}})
    try:
        # gpu-1 first if the scheduler can have it, else gpu-0.
        pod(core, ns, "refused", node, template(resource_api, ns, "refused", [first_available(
            "gpu-1", "gpu-0")]))  # fmt: skip
        pod(core, ns, "other", node, template(resource_api, ns, "other", [gpu_request(
            fabric_device="gpu-2")]))  # fmt: skip
        running(env, core, ns, "other")
        running(env, core, ns, "refused", timeout=150)
        claim = claim_of(core, resource_api, ns, "refused")
        (result,) = claim.status.allocation.devices.results
        assert attr(fabric_pool(resource_api)[result.device], "fabricDevice") == "gpu-0"
        assert conditions(claim, result.device) == {"FabricDeviceReady": "True"}
        method = "POST" if env.dialect == "connections" else "PATCH"
        event = told(core, ns, claim.metadata.name, REFUSED, "gpu-1", f"fabric {method} /redfish/",
                     "HTTP 400 ActionNotSupported", "held out of the pool")  # fmt: skip
        assert event.type == "Warning"
        assert "gpu-1" not in pool_devices(resource_api)  # held
        assert set(env.fabric.connections()) == {"gpu-0", "gpu-2"}
        gone(core, ns, "refused", "other")
        wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)
    finally:
        env.fabric.faults(devices={"gpu-1": {"refuseAttach": False}})
        # The hold is the controller's memory: a restart gives gpu-1 back now.
        env.ctl.stop()
        env.ctl.start()
    wait_for(
        "pool whole again", lambda: len(fabric_pool(resource_api)) == env.pool_size, timeout=60
    )
