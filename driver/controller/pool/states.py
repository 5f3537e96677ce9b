"""What the fabric pool holds, read back: device states for a metric, devices published before.

Why a module: the reconciler counts the fabric's devices by state for
``patchbay_fabric_devices`` and, on its first pass, reads what a previous
incarnation published (an allocated variant stays published from it). Both
read the pool rather than build it. Pure functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from driver.devices.model import Device
from driver.fabricclient.model import FabricInventory


def device_states(
    inventory: FabricInventory | None, held: Collection[str]
) -> list[tuple[tuple[str, str], float]]:
    """``patchbay_fabric_devices`` samples: (type, state) and a count, every
    state of each type present. A device whose connection failed (broken
    half-way: what is on the host is unknown until it is detached again) is
    failed, else attached (a connection, also one on its way in or out),
    else held (after a failed attach), else unavailable (another tenant's,
    or health Critical), else free."""
    counts: dict[tuple[str, str], int] = {}
    for d in inventory.devices if inventory is not None else ():
        if d.connection is not None and d.connection.state == "Failed":
            state = "failed"
        elif d.connection is not None:
            state = "attached"
        elif d.id in held:
            state = "held"
        elif not d.available or d.health == "Critical":
            state = "unavailable"
        else:
            state = "free"
        counts[(d.kind, state)] = counts.get((d.kind, state), 0) + 1
    kinds = sorted({k for k, _ in counts})
    states = ("free", "attached", "failed", "held", "unavailable")
    return [((k, s), float(counts.get((k, s), 0))) for k in kinds for s in states]


def carry_held_back(new: FabricInventory, last: FabricInventory | None) -> FabricInventory:
    """``new`` with each device it holds back (something about it could not be
    read) as ``last`` showed it: a partial read never means a device is gone,
    so nothing is unpublished or detached because of one (issue 35). A device
    held back that was never seen stays out until it is read whole."""
    held = {ident for ident, _ in new.held_back}
    have = {d.id for d in new.devices}
    kept = [d for d in (last.devices if last is not None else ()) if d.id in held - have]
    if not kept:
        return new
    return dataclasses.replace(new, devices=(*new.devices, *kept))


def published_devices(slices: Iterable[Mapping[str, Any]]) -> dict[str, Device]:
    """The devices of stored fabric pool slices, by name (malformed ones skipped)."""
    out = {}
    for obj in slices:
        for raw in (obj.get("spec") or {}).get("devices") or ():
            with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                device = Device.from_json(raw)
                out[device.name] = device
    return out
