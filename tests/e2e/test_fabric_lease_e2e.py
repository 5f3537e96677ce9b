"""A fabric GPU's lease ends in a detach, and the device is back in the pool (issue 37).

How: the fabric env (tests/e2e/conftest.py: two simulated nodes, a real
``patchbay-fabric``, the controller under hack/rbac/controller.yaml, the
per-domain pool shape, the default) with the controller's lease clock on
(``--device-leases``) and the chart's lease objects applied (the
DeviceLeasePolicy CRD and the admission policies). A namespace under a
policy with a warning and a short grace period gets a standalone claim for
the fabric GPU ``gpu-2`` with a short lease and a pod using it. What is
asserted is order and content, never how long anything took: the claim's
lease Events (LeaseStarted, LeaseExpiring, LeaseExpired), the device
attached before the expiry and ``Detached`` after it, the pod evicted, the
claim deleted, exactly one detach of ``gpu-2`` in the fabric's log, the
device published free in its domain pool and a new claim getting it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from driver.fabric_devices.naming import in_fabric_pool
from tests.e2e import pods
from tests.e2e.fabric_helpers import Env, attr, detaches, fabric_pool, gpu_request, running
from tests.e2e.helpers import events_about, unique, wait_for
from tests.e2e.lease_cluster import claim_gone, leases, reasons

pytestmark = pytest.mark.cluster
__all__ = ["leases"]  # the shared fixture

REASON, DURATION = "patchbay.dev/lease-reason", "patchbay.dev/lease-duration"
EXPIRY = "patchbay.dev/lease-expiry"
DEVICE = "gpu-2"  # sw1's GPU: its own reach domain
GRACE = 1  # the policy's eviction grace period


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return ("--device-leases=true",)


@pytest.fixture
def team(core: client.CoreV1Api, namespace: str, leases: Any) -> Iterator[str]:
    """``namespace``, governed by a policy: 15s of warning, grace period GRACE."""
    label = unique("team")
    core.patch_namespace(namespace, {"metadata": {"labels": {"fabric-lease": label}}})
    name = unique("fabric-short")
    leases.create(body={
        "apiVersion": "patchbay.dev/v1alpha1", "kind": "DeviceLeasePolicy",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {"fabric-lease": label}},
                 "deviceClassNames": ["gpu.patchbay.dev"], "requireReason": True,
                 "maxDuration": "1h", "warningBefore": "15s",
                 "evictionGracePeriodSeconds": GRACE},
    })  # fmt: skip
    yield namespace
    leases.delete(name=name)


def fabric_claim(resource_api: client.ResourceV1Api, ns: str, duration: str) -> str:
    """A standalone claim for the fabric GPU DEVICE with a ``duration`` lease; its name."""
    name = unique("c")
    resource_api.create_namespaced_resource_claim(ns, {
        "metadata": {"name": name, "annotations": {REASON: "e2e", DURATION: duration}},
        "spec": {"devices": {"requests": [gpu_request(fabric_device=DEVICE)]}},
    })  # fmt: skip
    return name


def free_in_pool(resource_api: client.ResourceV1Api) -> bool:
    """DEVICE published in its domain pool and allocated to no claim."""
    published = [d for d in fabric_pool(resource_api).values() if attr(d, "fabricDevice") == DEVICE]
    held = {
        (r.pool, r.device)
        for c in resource_api.list_resource_claim_for_all_namespaces().items
        if c.status and c.status.allocation
        for r in c.status.allocation.devices.results or ()
        if in_fabric_pool(r.pool, "fabric")
    }
    return len(published) == 1 and not any(r[1] == published[0].name for r in held)


def test_a_fabric_gpus_lease_ends_in_one_detach_and_the_device_is_back_in_the_pool(
    env: Env, team: str, core: client.CoreV1Api, resource_api: client.ResourceV1Api
) -> None:
    node = env.nodes[0].name
    assert free_in_pool(resource_api)
    claim = fabric_claim(resource_api, team, "45s")
    pods.pod(core, team, "p", node, {"resourceClaimName": claim})
    running(env, core, team, "p", timeout=150)
    assert env.fabric.connections()[DEVICE][0] == node
    wait_for("the lease stamped", lambda: "LeaseStarted" in reasons(core, team, claim), timeout=60)
    expiry = resource_api.read_namespaced_resource_claim(claim, team).metadata.annotations[EXPIRY]
    assert detaches(env, DEVICE) == 0

    wait_for("the pod evicted", lambda: env.check_alive() and pods.phase(core, team, "p") == "Gone",
             timeout=120)  # fmt: skip
    wait_for("the claim deleted", lambda: claim_gone(resource_api, team, claim), timeout=60)
    wait_for(f"{DEVICE} detached", lambda: DEVICE not in env.fabric.connections(), timeout=60)
    wait_for("the Detached Event", lambda: events_about(core, team, claim, "Detached"), timeout=30)
    assert detaches(env, DEVICE) == 1

    # Order: attached, warned, expired (at the first stamp), then detached.
    told = [str(e.reason) for e in events_about(core, team, claim)]
    assert [r for r in told if r.startswith("Lease")] == [
        "LeaseStarted", "LeaseExpiring", "LeaseExpired"
    ]  # fmt: skip
    assert told.index("Attached") < told.index("LeaseExpired") < told.index("Detached"), told
    assert reasons(core, team, "p") == ["LeaseExpiring", "LeaseExpired"]
    (expired,) = events_about(core, team, claim, "LeaseExpired")
    assert f"ended at {expiry}" in expired.message and f"grace period {GRACE}s" in expired.message
    (detached,) = events_about(core, team, claim, "Detached")
    assert f"fabric device {DEVICE} detached from node {node}" in detached.message

    # Back in the pool: published free, and a new claim (a new lease) gets it,
    # through the other node this time.
    wait_for(f"{DEVICE} free in its domain pool", lambda: free_in_pool(resource_api), timeout=60)
    again, other = fabric_claim(resource_api, team, "1h"), env.nodes[1].name
    pods.pod(core, team, "q", other, {"resourceClaimName": again})
    running(env, core, team, "q", timeout=150)
    assert env.fabric.connections()[DEVICE][0] == other
    (result,) = resource_api.read_namespaced_resource_claim(
        again, team
    ).status.allocation.devices.results
    assert in_fabric_pool(result.pool, "fabric") and result.device
    pods.gone(core, team, "q")
    resource_api.delete_namespaced_resource_claim(again, team)
    wait_for(f"{DEVICE} detached again", lambda: DEVICE not in env.fabric.connections(),
             timeout=60)  # fmt: skip
    assert detaches(env, DEVICE) == 2
