"""Write a fabric allocation's binding condition into its claim's status.

Why: the attach workers set ``FabricDeviceReady`` or ``FabricDeviceFailed``
on the claim's ``status.devices`` entry, and the scheduler's PreBind waits
for exactly that. The write is a read-modify-write on the claim's status
subresource with the claim's resourceVersion, so a concurrent writer (the
scheduler, another device's worker) makes it re-read and try again instead
of being overwritten. A claim that no longer holds the allocation is left
alone. Kept apart from the reconciler so that the workers get only this.

Concurrency: coroutines on the controller's asyncio loop.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from driver.controller import claims as cl
from driver.errors import ApiError, ApiStatusError
from driver.kube.api import claim_path

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 8


class ClaimsApi(Protocol):
    """The part of :class:`driver.kube.api.KubeApi` the writer uses."""

    async def get(self, path: str) -> dict[str, Any]: ...
    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


class ClaimStatusWriter:
    """Sets one condition on one fabric allocation's entry of a claim."""

    def __init__(self, api: ClaimsApi, pool: str) -> None:
        self._api = api
        self._pool = pool

    async def write(
        self, a: cl.FabricAllocation, cond: dict[str, Any], data: dict[str, Any] | None
    ) -> bool:
        """Write ``cond`` (and ``data``) on the claim's entry; False when the allocation is gone.

        Raises :class:`driver.errors.ApiError` for a failure other than a conflict.
        """
        path = claim_path(a.namespace, a.name)
        pool = a.pool or self._pool
        for _ in range(CONFLICT_RETRIES):
            try:
                claim = await self._api.get(path)
            except ApiError as exc:
                log.info("claim %s/%s: %s", a.namespace, a.name, exc)
                return False
            if not cl.is_allocated_with(claim, a.claim_uid, pool, a.device):
                log.info("claim %s/%s no longer holds %s", a.namespace, a.name, a.device)
                return False
            devices = cl.devices_with_condition(claim, pool, a.device, cond, data)
            body = {
                "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
                "status": {"devices": devices},
            }
            try:
                await self._api.merge_patch(path + "/status", body)
                return True
            except ApiStatusError as exc:
                if not exc.conflict:
                    raise
        return False
