"""The Idle condition on a claim's device status, as the node plugin writes it.

Why this channel: the controller must learn which claims' devices are idle,
and the plugin may write little (least privilege). A claim's
``status.devices`` entry belongs to the driver of its device (KEP-4817),
and since 1.36 the apiserver lets a ServiceAccount write entries of driver
``patchbay.dev`` with the verb ``associated-node:patch`` on
``resourceclaims/driver`` only for claims allocated to the node its
pod-bound token names: the plugin writes conditions on its own node's
claims and its own driver's entries, nothing else (docs/leases.md).

How: server-side apply of the one entry with the one condition ``Idle``,
``force`` (the condition is ours alone; the controller's read-modify-write
of binding conditions co-owns every field it sent back unchanged, which
would otherwise conflict), with a field manager per device entry
(``patchbay.dev/idle/<device>[/<shareID>]``): an apply names the whole
intent of its manager, so one manager for the plugin would drop the Idle
of every entry a call leaves out. Conditions are a map keyed by ``type``:
``FabricDeviceReady``, which the controller writes in the same entry, is
never touched. The claim's UID rides along as a precondition: a claim
deleted and created again under its name is not written.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from driver import DRIVER_NAME
from driver.errors import ApiError, ApiStatusError
from driver.idle.sources import Held
from driver.idleterms import IDLE
from driver.kube.api import claim_path
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)

MANAGER_PREFIX = "patchbay.dev/idle/"


def field_manager(held: Held) -> str:
    suffix = held.device if held.share_id is None else f"{held.device}/{held.share_id}"
    return MANAGER_PREFIX + suffix


def timestamp(when: datetime) -> str:
    """``when`` as the API writes times (RFC 3339, UTC, seconds)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(idle: bool, reason: str, message: str, now: datetime) -> dict[str, Any]:
    return {
        "type": IDLE,
        "status": "True" if idle else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": timestamp(now),
    }


def apply_body(held: Held, cond: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": DRIVER_NAME, "pool": held.pool, "device": held.device}
    if held.share_id is not None:
        entry["shareID"] = held.share_id
    entry["conditions"] = [cond]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": held.claim, "namespace": held.namespace, "uid": held.claim_uid},
        "status": {"devices": [entry]},
    }


class ConditionWriter:
    """Writes one device's Idle condition on its claim."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api
        self._failing: set[Held] = set()  # warned once, then debug until a write succeeds

    async def idle_now(self, held: Held) -> bool | None:
        """Whether the claim says Idle=True for the device now (an earlier
        process wrote it); None when the claim cannot be read."""
        try:
            claim = await self._api.get(claim_path(held.namespace, held.claim))
        except ApiStatusError as exc:
            if exc.not_found:
                return False
            log.warning("claim %s/%s: cannot read its Idle: %s", held.namespace, held.claim, exc)
            return None
        except ApiError as exc:
            log.warning("claim %s/%s: cannot read its Idle: %s", held.namespace, held.claim, exc)
            return None
        if (claim.get("metadata") or {}).get("uid") != held.claim_uid:
            return False
        key = (DRIVER_NAME, held.pool, held.device, held.share_id)
        for entry in (claim.get("status") or {}).get("devices") or ():
            if (entry.get("driver"), entry.get("pool"), entry.get("device"),
                    entry.get("shareID")) != key:  # fmt: skip
                continue
            return any(c.get("type") == IDLE and c.get("status") == "True"
                       for c in entry.get("conditions") or ())  # fmt: skip
        return False

    async def write(self, held: Held, cond: dict[str, Any]) -> bool:
        """Apply ``cond``; True when done or moot (the claim is gone or was
        replaced), False when it failed and should be tried again."""
        path = claim_path(held.namespace, held.claim) + "/status"
        try:
            await self._api.apply(path, apply_body(held, cond), field_manager(held), force=True)
        except ApiStatusError as exc:
            if exc.status in (404, 409):  # gone, or another claim of that name now
                log.info("claim %s/%s: Idle not written: %s", held.namespace, held.claim, exc)
                return True
            self._failed(held, cond, exc)
            return False
        except ApiError as exc:
            self._failed(held, cond, exc)
            return False
        self._failing.discard(held)
        log.info("claim %s/%s: %s Idle=%s (%s)", held.namespace, held.claim, held.device,
                 cond["status"], cond["message"])  # fmt: skip
        return True

    def _failed(self, held: Held, cond: dict[str, Any], exc: ApiError) -> None:
        """Warn once per device (a plugin without the chart's RBAC would warn at
        every retry), then at debug level until a write succeeds."""
        level = logging.DEBUG if held in self._failing else logging.WARNING
        self._failing.add(held)
        log.log(level, "claim %s/%s: Idle=%s on %s not written (retried): %s", held.namespace,
                held.claim, cond["status"], held.device, exc)  # fmt: skip
