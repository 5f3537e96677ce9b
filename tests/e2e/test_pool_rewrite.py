"""What the real scheduler does with a pool caught half-way through a rewrite.

Why this module exists: the slice publisher (``driver/slices/diff.py``)
rewrites the whole pool at a new generation whenever anything in it
changes, one slice at a time. A pool of several slices (a MIG node's
partitions, a large VF pool) is therefore briefly mixed: some slices at the
new generation, the rest at the old one. Our safety rests on two facts of
the upstream allocator (``k8s.io/dynamic-resource-allocation/structured``,
1.37): the slices of an older generation are ignored, so a device that is
going away is never allocated from a stale slice; and a pool whose newest
generation has fewer slices than ``resourceSliceCount`` is *incomplete* and
not allocated from at all, so a claim being scheduled meanwhile waits (or
goes to another node) and is retried when the last slice lands. This is
also the price a state-aware device order would pay on every MIG prepare
(docs/design.md, "Device order"). The test drives the slices by hand, with
no plugin, so each intermediate state holds as long as the test needs.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.e2e.helpers import delete_quietly, device_class, make_node, pod_body, unique, wait_for

pytestmark = pytest.mark.cluster


def _slice(name: str, driver: str, node: str, generation: int, devices: list[str]) -> Any:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 2},
            "devices": [{"name": d} for d in devices],
        },
    }


def _rewrite(api: client.ResourceV1Api, body: Any) -> None:
    stored = api.read_resource_slice(body["metadata"]["name"])
    body["metadata"]["resourceVersion"] = stored.metadata.resource_version
    api.replace_resource_slice(body["metadata"]["name"], body)


def _unschedulable(core: client.CoreV1Api, pod: str, namespace: str) -> str:
    """The scheduler's message when it reported ``pod`` unschedulable, else ""."""
    p = core.read_namespaced_pod(pod, namespace)
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return str(c.message)
    return ""


def _claim_and_pod(
    api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str, driver: str, name: str
) -> None:
    request = {"name": "r", "exactly": {"deviceClassName": driver}}
    claim = {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
    api.create_namespaced_resource_claim(namespace, claim)
    core.create_namespaced_pod(namespace, pod_body(name, {"resourceClaimName": name}))


def _exists(api: client.ResourceV1Api, name: str, namespace: str) -> bool:
    try:
        api.read_namespaced_resource_claim(name, namespace)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_a_pool_half_way_through_a_rewrite_is_not_allocated_from(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    driver, node = f"{unique('rw')}.e2e.patchbay.dev", unique("node")
    first, second = f"{node}-0", f"{node}-1"
    try:
        resource_api.create_device_class(device_class(driver, driver))
        make_node(core, node)
        # Generation 1: dev-a in the first slice, dev-b in the second.
        resource_api.create_resource_slice(_slice(first, driver, node, 1, ["dev-a"]))
        resource_api.create_resource_slice(_slice(second, driver, node, 1, ["dev-b"]))
        # A canary proves the scheduler sees the node, the class and the
        # complete pool, so what follows is about the rewrite alone.
        _claim_and_pod(resource_api, core, namespace, driver, "canary")
        wait_for(
            "the canary to be bound from the complete pool",
            lambda: core.read_namespaced_pod("canary", namespace).spec.node_name,
        )
        core.delete_namespaced_pod("canary", namespace, grace_period_seconds=0)
        resource_api.delete_namespaced_resource_claim("canary", namespace)
        wait_for("the canary's claim to go", lambda: not _exists(resource_api, "canary", namespace))

        # The rewrite to generation 2 has written its first slice only: dev-b
        # is going away, dev-c replaces it in the second slice, not yet written.
        _rewrite(resource_api, _slice(first, driver, node, 2, ["dev-a"]))
        _claim_and_pod(resource_api, core, namespace, driver, "p")
        message = wait_for(
            "the scheduler to find the half-rewritten pool unusable",
            lambda: _unschedulable(core, "p", namespace),
            timeout=30,
        )
        assert "cannot allocate all claims" in message, message
        # Neither dev-a (new generation, pool incomplete) nor dev-b (old
        # generation) was taken.
        assert core.read_namespaced_pod("p", namespace).spec.node_name is None
        assert resource_api.read_namespaced_resource_claim("p", namespace).status.allocation is None

        # The last slice lands with dev-c in place of dev-b (and dev-a taken by
        # nobody else): the pod is retried and bound to a device of the new
        # generation, never to the departed dev-b.
        _rewrite(resource_api, _slice(second, driver, node, 2, ["dev-c"]))
        pod = wait_for(
            "the pod to be bound once the rewrite is complete",
            lambda: (p := core.read_namespaced_pod("p", namespace)).spec.node_name and p,
            timeout=90,
        )
        assert pod.spec.node_name == node
        allocation = resource_api.read_namespaced_resource_claim("p", namespace).status.allocation
        assert [r.device for r in allocation.devices.results] in (["dev-a"], ["dev-c"])
    finally:
        delete_quietly(core.delete_namespaced_pod, "p", namespace, grace_period_seconds=0)
        for name in (first, second):
            delete_quietly(resource_api.delete_resource_slice, name)
        delete_quietly(resource_api.delete_device_class, driver)
        delete_quietly(core.delete_node, node)
