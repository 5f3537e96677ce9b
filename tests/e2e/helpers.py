"""Small helpers shared by the cluster e2e tests.

Why this module exists: tests share one cluster, so they all need unique
names, polling with a clear timeout message (``wait_for``, the harness's
loop in ``tests.harness.poll``), hand-made Node, DeviceClass and Pod objects and
quiet cleanup; keeping those here keeps each test about its own behaviour.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.harness.poll import wait_for as wait_for  # re-exported for the e2e tests


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def unchanged(list_fn: Any, what: str, within: int, **query: Any) -> Any:
    """List, then watch from that listing's resourceVersion for ``within``
    seconds (the apiserver ends the watch) and fail at the first change: the
    way a test shows that something stays at rest. A write shows up here as
    it happens, whatever the machine's speed; none is missed between the
    listing and the watch. Returns the listing."""
    listing = list_fn(**query)
    stream = watch.Watch()
    for event in stream.stream(
        list_fn, resource_version=listing.metadata.resource_version,
        timeout_seconds=within, _request_timeout=within + 30, **query,
    ):  # fmt: skip
        if event["type"] == "BOOKMARK":
            continue
        stream.stop()
        meta = event["object"].metadata
        pytest.fail(f"{what} changed: {event['type']} {meta.name} (resourceVersion "
                    f"{meta.resource_version})")  # fmt: skip
    return listing


def make_node(core: client.CoreV1Api, name: str, labels: dict[str, str] | None = None) -> None:
    """A Node object with capacity and a Ready condition, as a kubelet would post it."""
    core.create_node({"metadata": {"name": name, "labels": labels or {}}})
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "hand-made by an e2e test",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }
    core.patch_node_status(name, {"status": status})


def delete_quietly(fn: Any, *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(ApiException):
        fn(*args, **kwargs)


def events_about(
    core: client.CoreV1Api, namespace: str, name: str, reason: str | None = None
) -> list[Any]:
    """The core/v1 Events about object ``name`` (and of ``reason``), oldest
    first: how ``kubectl describe`` and ``kubectl patchbay`` read them,
    whichever API wrote them (events.k8s.io/v1 Events are the same objects)."""
    selector = f"involvedObject.name={name}" + (f",reason={reason}" if reason else "")
    items = core.list_namespaced_event(namespace, field_selector=selector).items
    return sorted(
        items, key=lambda e: e.event_time or e.first_timestamp or e.metadata.creation_timestamp
    )


def device_class(name: str, driver: str) -> dict[str, Any]:
    """A DeviceClass selecting every device of ``driver``."""
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def pod_body(name: str, claim_ref: dict[str, str]) -> dict[str, Any]:
    """A one-container pod using the claim ``claim_ref`` names (a claim or template)."""
    return {
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "dev", **claim_ref}],
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}
            ],
        },
    }
