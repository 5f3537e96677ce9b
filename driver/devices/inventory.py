"""The devices a node can prepare right now, by pool and name.

Discovery replaces the node pool's contents whenever hardware changes
(hot-plug, MIG geometry); the preparer looks devices up here, and the slice
publisher builds the node's pool from the same snapshot, so what the
scheduler sees and what prepare accepts never disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from driver.devices.model import Device

# An attribute of an unpublished device: another name it answers to when no
# device has that name (a fabric CXL memdev's name from before LDs were told
# apart: driver.fabric_devices.node); looked up under the name asked.
ALIAS = "alias"


def serving(pool: str, pools: Iterable[str]) -> str | None:
    """The pool of ``pools`` that serves ``pool``: itself, or the one it is a
    sub-pool of (``<pool>/...``: the fabric pool's per-domain pools, whose
    devices the node prepares as its own fabric pool's), else None."""
    pools = set(pools)
    if pool in pools:
        return pool
    above = [p for p in pools if pool.startswith(p + "/")]
    return max(above, key=len) if above else None


class NodeInventory:
    """A snapshot of devices per pool, replaced atomically."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, Device]] = {}

    def replace_pool(self, pool: str, devices: Iterable[Device]) -> bool:
        """Set the devices of ``pool``; True when anything changed, their
        order included (the order is the scheduler's preference)."""
        new = {d.name: d for d in devices}
        old = self._pools.get(pool)
        changed = old is None or list(old.items()) != list(new.items())
        self._pools[pool] = new
        return changed

    def pools(self) -> frozenset[str]:
        return frozenset(self._pools)

    def lookup(self, pool: str, device: str) -> Device | None:
        """``device`` of ``pool``, or the one device there whose :data:`ALIAS` it
        is, under the name asked; None otherwise."""
        mine = serving(pool, self._pools)
        devices = self._pools[mine] if mine is not None else {}
        found = devices.get(device)
        if found is not None:
            return found
        aka = [d for d in devices.values() if d.attributes.get(ALIAS) == device]
        return dataclasses.replace(aka[0], name=device) if len(aka) == 1 else None

    def devices(self, pool: str) -> list[Device]:
        return list(self._pools.get(pool, {}).values())

    def snapshot(self) -> Mapping[str, Mapping[str, Device]]:
        return {p: dict(d) for p, d in self._pools.items()}
