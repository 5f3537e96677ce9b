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
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.helpers import events_about, wait_for

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
    except pytest.fail.Exception:
        said = [f"{e.reason}: {e.message}" for e in events_about(core, ns, name)]
        pytest.fail(f"pod {name} is not Running after {timeout:.0f}s; its events: {said}")


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
