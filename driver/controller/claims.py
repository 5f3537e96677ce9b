"""Read fabric allocations out of ResourceClaims and write their conditions.

Why: the scheduler copies a variant's binding conditions into the claim's
allocation and waits until the controller sets ``FabricDeviceReady=True``
(or ``FabricDeviceFailed=True``) in the ``status.devices`` entry keyed by
driver, pool and device. The scheduler watches the failure conditions it
copied into the allocation result when it allocated: an allocation made
from an older controller's pool lists ``FabricAttachFailed``, so that is
the name read and written for it (upgrades; docs/fabric.md). Pure
functions that read claims and compute the new ``status.devices`` list;
the reconciler sends it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver import DRIVER_NAME
from driver.devices.model import PCI_BUS_ID
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    LEGACY_FAILED_CONDITION,
    READY_CONDITION,
    in_fabric_pool,
    is_adapter_pool,
)
from driver.kube.reservations import allocated_node

# The key of ``status.devices[].data`` that holds an attach's operation handle
# while it is under way (replaced by the device's identity once it is ready).
OPERATION_KEY = "fabricOperation"
# Every failure condition a patchbay controller has set, newest first.
FAILURE_CONDITIONS = (FAILED_CONDITION, LEGACY_FAILED_CONDITION)


@dataclass(frozen=True)
class FabricAllocation:
    """One allocation result of the fabric pool, with its binding state."""

    claim_uid: str
    namespace: str
    name: str
    device: str
    ready: bool
    failed: bool
    # The handle of an attach under way (a task monitor or Task URI) that an
    # earlier incarnation recorded in the entry's data: resumed, never re-asked.
    operation: str = ""
    # Whether the scheduler copied binding conditions into the result: False
    # for a warm spare's variant (published without them), taken at once.
    waits: bool = True
    # The failure condition the scheduler watches for this allocation (the
    # one its result lists): the legacy name for an allocation made before
    # the rename, so that a failed attach still fails the binding at once.
    failure_condition: str = FAILED_CONDITION
    # The fabric device its status data names (``fabricDevice``): for a
    # count-based manager's slot, the device that arrived (attach.slot_attach).
    served: str = ""
    # The pool it was allocated from: the fabric pool, or one of its
    # per-domain pools (``driver.controller.pool.domain_pool``).
    pool: str = ""
    # The node the scheduler picked (``allocation.nodeSelector``), "" if none.
    node: str = ""
    # (pool, device) of the claim's results from the nodes' adapter pools
    # (a pairing: attach through that adapter; driver.controller.pool.adapter_pools).
    adapters: tuple[tuple[str, str], ...] = ()
    # CXL memory: the PCI function of the memdev its LD arrived as on the node
    # (status data ``pciBusID``; driver.controller.attach.memdevs), "" if none.
    memdev: str = ""


def _condition_true(entry: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in entry.get("conditions") or ()
    )


def _failure_condition(result: Mapping[str, Any]) -> str:
    listed = result.get("bindingFailureConditions") or ()
    return next((c for c in FAILURE_CONDITIONS if c in listed), FAILED_CONDITION)


def _entry(claim: Mapping[str, Any], pool: str, device: str) -> Mapping[str, Any]:
    for e in (claim.get("status") or {}).get("devices") or ():
        if (e.get("driver"), e.get("pool"), e.get("device")) == (DRIVER_NAME, pool, device):
            return dict(e)
    return {}


def _operation(entry: Mapping[str, Any]) -> str:
    data = entry.get("data")
    op = data.get(OPERATION_KEY) if isinstance(data, Mapping) else None
    return op if isinstance(op, str) else ""


def _served(entry: Mapping[str, Any], key: str = "fabricDevice") -> str:
    data = entry.get("data")
    served = data.get(key) if isinstance(data, Mapping) else None
    return served if isinstance(served, str) else ""


def fabric_allocations(claim: Mapping[str, Any], pool: str) -> list[FabricAllocation]:
    """The claim's allocation results from the fabric pool ``pool`` or its domain pools."""
    meta = claim.get("metadata") or {}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    node = allocated_node(allocation)
    results = [
        r
        for r in (allocation.get("devices") or {}).get("results") or ()
        if r.get("driver") == DRIVER_NAME and in_fabric_pool(str(r.get("pool")), pool)
    ]
    adapters = tuple(
        (str(r["pool"]), str(r["device"])) for r in results if is_adapter_pool(str(r["pool"]), pool)
    )
    out = []
    for r in results:
        if is_adapter_pool(str(r["pool"]), pool):  # the node's adapter: nothing to attach
            continue
        pool_of = str(r["pool"])
        entry = _entry(claim, pool_of, r["device"])
        out.append(
            FabricAllocation(
                claim_uid=str(meta.get("uid", "")),
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                device=str(r["device"]),
                ready=_condition_true(entry, READY_CONDITION),
                failed=any(_condition_true(entry, c) for c in FAILURE_CONDITIONS),
                operation=_operation(entry),
                waits=bool(r.get("bindingConditions")),
                failure_condition=_failure_condition(r),
                served=_served(entry),
                pool=pool_of,
                node=node,
                adapters=adapters,
                memdev=_served(entry, PCI_BUS_ID),
            )
        )
    return out


def condition(
    kind: str, reason: str, message: str, generation: int | None, status: str = "True"
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def devices_with_condition(
    claim: Mapping[str, Any],
    pool: str,
    device: str,
    cond: Mapping[str, Any],
    data: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``status.devices`` of ``claim`` with ``cond`` set on our entry (added if missing)."""
    key = (DRIVER_NAME, pool, device)
    out: list[dict[str, Any]] = []
    found = False
    for e in (claim.get("status") or {}).get("devices") or ():
        e = dict(e)
        if (e.get("driver"), e.get("pool"), e.get("device")) == key:
            found = True
            others = [c for c in e.get("conditions") or () if c.get("type") != cond["type"]]
            e["conditions"] = [*others, dict(cond)]
            if data is not None:
                e["data"] = dict(data)
        out.append(e)
    if not found:
        entry: dict[str, Any] = {"driver": key[0], "pool": pool, "device": device}
        entry["conditions"] = [dict(cond)]
        if data is not None:
            entry["data"] = dict(data)
        out.append(entry)
    return out


def is_allocated_with(claim: Mapping[str, Any], uid: str, pool: str, device: str) -> bool:
    """Whether ``claim`` is still the same claim and holds ``device`` of ``pool``."""
    if (claim.get("metadata") or {}).get("uid") != uid:
        return False
    return any((a.device, a.pool) == (device, pool) for a in fabric_allocations(claim, pool))


def all_allocations(claims: Sequence[Mapping[str, Any]], pool: str) -> list[FabricAllocation]:
    return [a for c in claims for a in fabric_allocations(c, pool)]
