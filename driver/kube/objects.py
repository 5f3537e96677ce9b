"""Reads of the few Kubernetes objects the node side needs.

The claim reader is what the preparer calls; the node lookup gives the
ownerReference our slices carry so that deleting the Node deletes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from driver.backoff import Backoff
from driver.errors import ApiError, ApiStatusError, ClaimError
from driver.kube.api import claim_path
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)


class ApiClaimReader:
    """GETs ResourceClaims for the preparer."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return await self._api.get(claim_path(namespace, name))
        except ApiStatusError as exc:
            if exc.not_found:
                raise ClaimError(f"claim {namespace}/{name} not found") from exc
            raise


def owner_reference(node: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node["metadata"]["name"],
        "uid": node["metadata"]["uid"],
        "controller": True,
    }


async def wait_for_node(api: KubeClient, name: str, max_delay: float = 10.0) -> dict[str, Any]:
    """The Node object; waits (with backoff) until it exists."""
    backoff = Backoff(cap=max_delay, jitter=0.5)  # every node's plugin may wait at once
    while True:
        try:
            return await api.get(f"/api/v1/nodes/{name}")
        except ApiError as exc:
            log.info("waiting for Node %s: %s", name, exc)
        await backoff.sleep()
