"""Read a ResourceClaim and pick out the allocation results we must prepare.

The kubelet names a claim only by namespace, name and UID; we GET the object
and check it is the same claim (a different UID means it was deleted and
re-created), that it is allocated, and which of its results belong to our
driver. Results of other drivers are ignored; a result of ours for a pool
this node does not serve is an error for that claim.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from driver import DRIVER_NAME
from driver.errors import ClaimError


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque configuration entry of our driver, as allocated."""

    source: str  # "FromClass" or "FromClaim"
    requests: tuple[str, ...]  # empty: applies to every request
    parameters: Mapping[str, Any]
    index: int  # position in status.allocation.devices.config (for messages)

    def applies_to(self, request: str) -> bool:
        parent = request.split("/", 1)[0]
        return not self.requests or request in self.requests or parent in self.requests


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of our driver."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    admin_access: bool = False


@dataclass(frozen=True)
class Allocation:
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...]

    def configs_for(self, request: str) -> list[OpaqueConfig]:
        """Configs for ``request`` in precedence order: class before claim,
        each in written order, so a later entry wins."""
        matching = [c for c in self.configs if c.applies_to(request)]
        return sorted(matching, key=lambda c: (c.source != "FromClass", c.index))


def parse_allocation(
    claim: Mapping[str, Any], uid: str, pools: Collection[str], driver: str = DRIVER_NAME
) -> Allocation:
    """Our part of ``claim``'s allocation, or :class:`ClaimError`."""
    meta = claim.get("metadata", {})
    if meta.get("uid") != uid:
        raise ClaimError(
            f"claim {meta.get('namespace')}/{meta.get('name')} has UID {meta.get('uid')}, "
            f"expected {uid}: it was replaced"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {meta.get('namespace')}/{meta.get('name')} is not allocated")
    section = allocation.get("devices") or {}
    devices = []
    for result in section.get("results") or []:
        if result.get("driver") != driver:
            continue
        if result.get("pool") not in pools:
            raise ClaimError(
                f"device {result.get('device')} is allocated from pool {result.get('pool')}, "
                f"which this node does not serve ({', '.join(sorted(pools))})"
            )
        devices.append(
            AllocatedDevice(
                request=result["request"],
                pool=result["pool"],
                device=result["device"],
                share_id=result.get("shareID"),
                admin_access=bool(result.get("adminAccess")),
            )
        )
    configs = []
    for index, entry in enumerate(section.get("config") or []):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        configs.append(
            OpaqueConfig(
                source=entry.get("source", "FromClaim"),
                requests=tuple(entry.get("requests") or ()),
                parameters=opaque.get("parameters") or {},
                index=index,
            )
        )
    return Allocation(devices=tuple(devices), configs=tuple(configs))
