"""Evicting a pod through the Eviction API, and what its answer means.

Why: an expired lease takes its devices back by evicting the pods that use
them, and only ever through ``pods/eviction``, so that a
PodDisruptionBudget is honoured: the apiserver answers 429 while a budget
allows no disruption, and the pod stays until a retry is allowed. The
eviction names the pod's uid as a precondition, so a pod recreated under
the same name is never evicted for a lease it does not hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from driver.errors import ApiStatusError
from driver.kube.client import KubeClient

EVICTED, GONE, BLOCKED = "evicted", "gone", "blocked"


@dataclass(frozen=True)
class Outcome:
    """``kind`` EVICTED, GONE (no such pod, or another one by that name) or
    BLOCKED (a disruption budget; ``why`` is the apiserver's message)."""

    kind: str
    why: str = ""


def _message(exc: ApiStatusError) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.body)
    except (ValueError, AttributeError):
        return str(exc.body)


async def evict(api: KubeClient, namespace: str, name: str, uid: str, grace: int | None) -> Outcome:
    """Ask the apiserver to evict pod ``namespace/name`` (if it is still ``uid``);
    other failures raise (:class:`driver.errors.ApiError`): the caller retries."""
    options: dict[str, object] = {"preconditions": {"uid": uid}} if uid else {}
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": options,
    }
    try:
        await api.create(f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)
    except ApiStatusError as exc:
        if exc.status == 404 or exc.status == 409:  # gone, or a new pod by that name
            return Outcome(GONE)
        if exc.status == 429:
            return Outcome(BLOCKED, _message(exc))
        raise
    return Outcome(EVICTED)
