"""Devices of our pools as plain facts: who holds what, what is still free.

Input is the JSON of ``resource.k8s.io/v1`` ResourceSlices and
ResourceClaims as the API returns them. A device is *used* when some
claim's ``status.allocation.devices.results`` names its driver, pool and
device; it is *free* when it is not used and every counter it consumes is
still left in its pool's counter sets (a GPU cut into MIG slices is
neither: it is ``blocked``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver import DRIVER_NAME
from driver.kube.reservations import reserved_for

JsonObj = Mapping[str, Any]
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
FREE, USED, BLOCKED = "free", "used", "blocked"


@dataclass(frozen=True)
class Holder:
    """The claim an allocated device belongs to and who reserves it (pods, ``podgroup/<g>``)."""

    namespace: str
    name: str
    pods: tuple[str, ...] = ()

    @property
    def claim(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Dev:
    """One published device with its allocation state."""

    pool: str
    name: str
    raw: JsonObj
    node: str
    holder: Holder | None = None
    state: str = FREE

    def attr(self, key: str) -> Any:
        attrs = self.raw.get("attributes") or {}
        value = attrs.get(key)
        if value is None and "/" not in key:
            value = attrs.get(f"{DRIVER_NAME}/{key}")
        if value is None:
            return None
        return next(iter(value.values()), None)

    @property
    def type(self) -> str:
        return str(self.attr("type") or "?")

    @property
    def fabric(self) -> bool:
        return bool(self.attr("attachment") == "fabric")

    @property
    def taints(self) -> list[JsonObj]:
        return list(self.raw.get("taints") or [])

    def consumes(self) -> list[tuple[str, str, int]]:
        """``(counterSet, counter, amount)`` this device takes from its pool."""
        out = []
        for cc in self.raw.get("consumesCounters") or []:
            for counter, qty in (cc.get("counters") or {}).items():
                out.append((str(cc["counterSet"]), str(counter), _int(qty)))
        return out


@dataclass
class Inventory:
    devices: list[Dev] = field(default_factory=list)
    counters: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def on_node(self, node: str) -> list[Dev]:
        return [d for d in self.devices if d.node == node]

    def nodes(self) -> list[str]:
        return sorted({d.node for d in self.devices if d.node})


def _int(qty: Any) -> int:
    value = qty.get("value") if isinstance(qty, Mapping) else qty
    try:
        return int(str(value))
    except ValueError:
        return 0


def holders(claims: Iterable[JsonObj], driver: str = DRIVER_NAME) -> dict[tuple[str, str], Holder]:
    """``(pool, device)`` -> holder, for every allocation result of ``driver``."""
    out: dict[tuple[str, str], Holder] = {}
    for claim in claims:
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        pods = reserved_for(claim).labels()  # a PodGroup as podgroup/<name>
        holder = Holder(str(meta.get("namespace", "")), str(meta.get("name", "")), pods)
        allocation = status.get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == driver:
                out[(str(result.get("pool")), str(result.get("device")))] = holder
    return out


def build(
    slices: Iterable[JsonObj], claims: Iterable[JsonObj], driver: str = DRIVER_NAME
) -> Inventory:
    """Every device ``driver`` publishes, with holder and state filled in."""
    inv = Inventory()
    held = holders(claims, driver)
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        for cs in spec.get("sharedCounters") or []:
            for counter, qty in (cs.get("counters") or {}).items():
                inv.counters[(pool, str(cs["name"]), str(counter))] = _int(qty)
        for raw in spec.get("devices") or []:
            node = str(raw.get("nodeName") or spec.get("nodeName") or "")
            dev = Dev(pool, str(raw["name"]), raw, node, held.get((pool, str(raw["name"]))))
            inv.devices.append(dev)
    left = dict(inv.counters)
    for d in inv.devices:
        if d.holder is not None:
            d.state = USED
            for cs, counter, amount in d.consumes():
                key = (d.pool, cs, counter)
                if key in left:
                    left[key] -= amount
    for d in inv.devices:
        if d.holder is None and any(
            left.get((d.pool, cs, c), amount) < amount for cs, c, amount in d.consumes()
        ):
            d.state = BLOCKED
    return inv
