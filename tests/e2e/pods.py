"""Pods of the e2e tests: one claim each, their phase, waits and deletion.

Why this module exists: the MIG, pairing, sharing, plugin, tenant and
fabric modules each had their own copy of "a pause pod with one claim on
a node", "its phase, Gone once deleted", "wait until Running" and "the
claim the pod got". One copy here; a wait that fails shows the pod's
Events, which is what a user would read first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.e2e.helpers import events_about, wait_for
from tests.harness.poll import WaitTimedOut

CLAIM = "dev"  # the pod's name for its claim (resourceClaims[].name)


def pod(
    core: client.CoreV1Api,
    ns: str,
    name: str,
    node: str | None,
    claim: str | dict[str, str],
    containers: int = 1,
) -> None:
    """A pause pod on ``node`` (any node when None) whose ``containers``
    containers all use one claim: from the template named ``claim``, or as
    given (``{"resourceClaimName": ...}``)."""
    source = {"resourceClaimTemplateName": claim} if isinstance(claim, str) else claim
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}" if containers > 1 else "main", "image": "pause",
             "resources": {"claims": [{"name": CLAIM}]}}
            for i in range(containers)
        ],
        "resourceClaims": [{"name": CLAIM, **source}],
    }  # fmt: skip
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": spec})


def phase(core: client.CoreV1Api, ns: str, name: str) -> str:
    """The pod's phase; ``Gone`` once it no longer exists."""
    try:
        return str(core.read_namespaced_pod(name, ns).status.phase)
    except ApiException as exc:
        if exc.status == 404:
            return "Gone"
        raise


def running(
    core: client.CoreV1Api,
    ns: str,
    name: str,
    timeout: float = 90,
    alive: Callable[[], object] | None = None,
) -> None:
    """Wait until the pod runs (``alive`` raises if a process it needs died)."""

    def probe() -> bool:
        if alive is not None:
            alive()
        return phase(core, ns, name) == "Running"

    try:
        wait_for(f"pod {name} Running", probe, timeout=timeout)
    except WaitTimedOut:
        said = [f"{e.reason}: {e.message}" for e in events_about(core, ns, name)]
        pytest.fail(f"pod {name} is not Running after {timeout:.0f}s; its events: {said}")


def refused(core: client.CoreV1Api, ns: str, name: str, timeout: float = 60) -> str:
    """Wait until the scheduler has tried the pod and found no fit (PodScheduled
    False); fail at once if it binds the pod instead. The scheduler's message.

    The signal that a pod "stays Pending": the scheduler's own verdict, not a
    phase read after a fixed sleep."""

    def verdict() -> str | None:
        pod = core.read_namespaced_pod(name, ns)
        if pod.spec.node_name:
            pytest.fail(f"pod {name} was bound to {pod.spec.node_name}")
        for cond in pod.status.conditions or ():
            if cond.type == "PodScheduled" and cond.status == "False":
                return str(cond.message or cond.reason)
        return None

    return str(wait_for(f"the scheduler to refuse pod {name}", verdict, timeout=timeout))


def never_bound(core: client.CoreV1Api, ns: str, name: str, within: int) -> None:
    """Watch the pod for ``within`` seconds (the apiserver ends the watch) and fail
    at the first state that has it bound to a node: a change the scheduler makes
    shows up here as it happens, whatever the machine's speed."""
    stream = watch.Watch()
    for event in stream.stream(
        core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}",
        timeout_seconds=within, _request_timeout=within + 30,
    ):  # fmt: skip
        node = event["object"].spec.node_name
        if node:
            stream.stop()
            pytest.fail(f"pod {name} was bound to {node} ({event['type']})")


def gone(core: client.CoreV1Api, ns: str, *names: str) -> None:
    """Delete the pods and wait until they no longer exist."""
    for name in names:
        core.delete_namespaced_pod(name, ns)
    for name in names:
        wait_for(f"pod {name} gone", lambda n=name: phase(core, ns, n) == "Gone", timeout=60)


def claim_of(core: client.CoreV1Api, resource_api: client.ResourceV1Api, ns: str, name: str) -> Any:
    """The (first) ResourceClaim the pod got."""
    status = core.read_namespaced_pod(name, ns).status
    claim = status.resource_claim_statuses[0].resource_claim_name
    return resource_api.read_namespaced_resource_claim(claim, ns)
