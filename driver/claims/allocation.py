"""Read a ResourceClaim and pick out the allocation results we must prepare.

The kubelet names a claim only by namespace, name and UID; we GET the object
and check it is the same claim (a different UID means it was deleted and
re-created), that it is allocated, and which of its results belong to our
driver. Results of other drivers are ignored, and so are those of the node's
fabric adapter pool (a pairing's adapter: nothing to prepare, the controller
attached the claim's fabric devices through it); a result of ours for a pool
this node does not serve is an error for that claim.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver import DRIVER_NAME
from driver.devices.inventory import serving
from driver.errors import ClaimError
from driver.fabric_devices.naming import PREPARED_AS_KEY, is_adapter_pool


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
    # What a share of an allow-multiple device consumed (capacity -> quantity).
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    # A count-based fabric manager's slot: the node's own name of the device
    # that arrived for it, from the claim's device status data (the
    # controller's ``PREPARED_AS_KEY``); prepared as that device.
    prepared_as: str = ""


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
    """Our part of ``claim``'s allocation, or :class:`ClaimError` (naming the
    field, e.g. ``status.allocation.devices.results[0].pool``, when one has
    the wrong type)."""
    meta = _object(claim.get("metadata"), "metadata", "claim")
    name = f"claim {meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        raise ClaimError(f"{name} has UID {meta.get('uid')}, expected {uid}: it was replaced")
    allocation = _object(claim.get("status"), "status", name).get("allocation")
    if not allocation:
        raise ClaimError(f"{name} is not allocated")
    allocation = _object(allocation, "status.allocation", name)
    section = _object(allocation.get("devices"), "status.allocation.devices", name)
    devices = []
    for path, result in _objects(section, "results", name):
        if result.get("driver") != driver:
            continue
        pool = _text(result.get("pool"), f"{path}.pool", name)
        if any(is_adapter_pool(pool, p) for p in pools):
            continue  # the node's fabric adapter: the controller attached through it
        if serving(pool, pools) is None:
            raise ClaimError(
                f"device {result.get('device')} is allocated from pool {pool}, "
                f"which this node does not serve ({', '.join(sorted(pools))})"
            )
        share_id = result.get("shareID")
        device = _text(result.get("device"), f"{path}.device", name)
        consumed = _object(result.get("consumedCapacity"), f"{path}.consumedCapacity", name)
        devices.append(
            AllocatedDevice(
                request=_text(result.get("request"), f"{path}.request", name),
                pool=pool,
                device=device,
                share_id=None if share_id is None else _text(share_id, f"{path}.shareID", name),
                admin_access=bool(result.get("adminAccess")),
                consumed_capacity={
                    k: _text(v, f"{path}.consumedCapacity.{k}", name) for k, v in consumed.items()
                },
                prepared_as=_prepared_as(claim, driver, pool, device),
            )
        )
    configs = []
    for index, (path, entry) in enumerate(_objects(section, "config", name)):
        opaque = _object(entry.get("opaque"), f"{path}.opaque", name)
        if opaque.get("driver") != driver:
            continue
        requests = entry.get("requests") or []
        if not isinstance(requests, list):
            raise ClaimError(f"{name}: {path}.requests must be a list, got {_type(requests)}")
        configs.append(
            OpaqueConfig(
                source=_text(entry.get("source", "FromClaim"), f"{path}.source", name),
                requests=tuple(
                    _text(r, f"{path}.requests[{i}]", name) for i, r in enumerate(requests)
                ),
                parameters=opaque.get("parameters") or {},
                index=index,
            )
        )
    return Allocation(devices=tuple(devices), configs=tuple(configs))


def _prepared_as(claim: Mapping[str, Any], driver: str, pool: str, device: str) -> str:
    """``PREPARED_AS_KEY`` of the device's status entry ("" if none or not text)."""
    for entry in (claim.get("status") or {}).get("devices") or ():
        if isinstance(entry, Mapping) and (
            entry.get("driver"),
            entry.get("pool"),
            entry.get("device"),
        ) == (driver, pool, device):
            data = entry.get("data")
            name = data.get(PREPARED_AS_KEY) if isinstance(data, Mapping) else None
            return name if isinstance(name, str) else ""
    return ""


# The apiserver validates claims, so these only fail on a claim another
# client wrote oddly (or a version skew); each names the field at fault.


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _object(value: Any, path: str, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"{name}: {path} must be an object, got {_type(value)}")
    return value


def _objects(
    section: Mapping[str, Any], key: str, name: str
) -> list[tuple[str, Mapping[str, Any]]]:
    path = f"status.allocation.devices.{key}"
    items = section.get(key) or []
    if not isinstance(items, list):
        raise ClaimError(f"{name}: {path} must be a list, got {_type(items)}")
    return [(f"{path}[{i}]", _object(item, f"{path}[{i}]", name)) for i, item in enumerate(items)]


def _text(value: Any, path: str, name: str) -> str:
    if not isinstance(value, str):
        raise ClaimError(f"{name}: {path} must be a string, got {_type(value)}")
    return value
