"""The fabric pool's shape: the :class:`PoolModel` protocol and its implementations.

Why a module: what the pool offers depends on who picks the device. A
manager that attaches the device it is asked for gets a variant per device
(:class:`DevicePool`, ``driver.controller.pool.devices``); a count-based
manager, which attaches "one of model X" and picks the device itself, gets
model slots (:class:`SlotPool`, ``driver.controller.pool.slots``), with
what follows from that: the device a slot allocation holds is the one that
arrived for it, what is attached already is taken up
(``driver.controller.pool.slot_serving``), and warm spares are published as
device variants that must give way to waiting slots
(``driver.controller.pool.slot_spares``). Under ``fabric_pool_shape:
per-domain`` each device (:class:`~driver.controller.pool.domain_pool.DomainPool`)
or slot (:class:`~driver.controller.pool.domain_slot_pool.DomainSlotPool`)
is published once per reach domain instead. The reconciler holds one model
(:func:`pool_model`, from the fabric client's ``picks_devices`` and the
setting) and never asks which. Pure, except ``take_up``, which tells the workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from driver.controller import claims as cl
from driver.controller.pool import slot_serving, slot_spares
from driver.controller.pool.devices import build_pool
from driver.controller.pool.domain_pool import DomainPool
from driver.controller.pool.domain_slot_pool import DomainSlotPool
from driver.controller.pool.domains import LabelFinding
from driver.controller.pool.slots import build_count_pool
from driver.controller.pool.variant import Variant
from driver.devices.model import PCI_BUS_ID, Device
from driver.fabric_devices.naming import NodeFabric, cxl_bdf_of
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec

Allocations = Iterable[cl.FabricAllocation]


Pools = tuple[PoolSpec, ...]


class PoolModel(Protocol):
    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
        served: Mapping[str, str], node_objects: Iterable[Mapping[str, Any]],
    ) -> tuple[Pools, dict[str, Variant]]:  # fmt: skip
        """The pool specs and their variants by name (``devices.build_pool``'s
        arguments; ``pinned``: allocated variant -> the pool it was allocated
        from; ``served``: allocated variant -> the device it holds;
        ``node_objects``: the Nodes, for their labels)."""
        ...

    def findings(self) -> tuple[LabelFinding, ...]:
        """The Nodes whose reach label disagrees with their adapters, as of the
        last build (none for a shape that selects no Node by label)."""
        ...

    def holds_back(self) -> bool:
        """Whether the last ``with_spares`` held a ready spare back until the
        pool without its old publication is stored (a pass is due then)."""
        ...

    def place(
        self, v: Variant, a: cl.FabricAllocation, inv: FabricInventory,
        reports: Mapping[str, NodeFabric],
    ) -> Variant:  # fmt: skip
        """``v`` as allocation ``a`` holds it: on its node, through an adapter
        there (a variant that names them already is returned as it is)."""
        ...

    def device_of(self, v: Variant, served: str) -> str:
        """The fabric device an allocation of ``v`` holds (``served``: the one
        that arrived for it, "" if none)."""
        ...

    def take_up(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric], allocs: Allocations,
        variants: Mapping[str, Variant], workers: slot_serving.Serving,
        stored: Iterable[Mapping[str, Any]], spares: Collection[str],
    ) -> None:  # fmt: skip
        """Give waiting allocations what is attached already for them
        (``stored``: the stored slices; ``spares``: the spares kept last pass)."""
        ...

    def models(self, variants: Iterable[Variant]) -> dict[str, str]:
        """Device id -> model, for the variants that name no fabric device."""
        ...

    def shortfall(
        self, inv: FabricInventory, allocs: Allocations, variants: Mapping[str, Variant],
        served: Callable[[cl.FabricAllocation], str], in_use: Collection[str],
        leaving: Callable[[str], bool],
    ) -> tuple[set[str], set[str]]:  # fmt: skip
        """(free devices no spare may take, spares to release) for waiting allocations."""
        ...

    def with_spares(
        self, specs: Pools, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        spares: Mapping[str, Variant],
    ) -> tuple[Pools, dict[str, Variant]]:  # fmt: skip
        """``specs`` with the ready spares ``spares`` (by the names their nodes
        know them by) published; the variants added."""
        ...


class DevicePool:
    """A variant per device: every device is offered by name, spares included."""

    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
        served: Mapping[str, str], node_objects: Iterable[Mapping[str, Any]],
    ) -> tuple[Pools, dict[str, Variant]]:  # fmt: skip
        spec, variants = build_pool(pool, inventory, nodes, excluded, mine(pinned, pool), carried)
        return (spec,), variants

    def findings(self) -> tuple[LabelFinding, ...]:
        return ()

    def holds_back(self) -> bool:
        return False

    def place(
        self, v: Variant, a: cl.FabricAllocation, inv: FabricInventory,
        reports: Mapping[str, NodeFabric],
    ) -> Variant:  # fmt: skip
        return v  # a variant per node and adapter

    def device_of(self, v: Variant, served: str) -> str:
        return v.device_id

    def take_up(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric], allocs: Allocations,
        variants: Mapping[str, Variant], workers: slot_serving.Serving,
        stored: Iterable[Mapping[str, Any]], spares: Collection[str],
    ) -> None:  # fmt: skip
        return None  # a variant names its device: nothing to take up

    def models(self, variants: Iterable[Variant]) -> dict[str, str]:
        return {}

    def shortfall(
        self, inv: FabricInventory, allocs: Allocations, variants: Mapping[str, Variant],
        served: Callable[[cl.FabricAllocation], str], in_use: Collection[str],
        leaving: Callable[[str], bool],
    ) -> tuple[set[str], set[str]]:  # fmt: skip
        return set(), set()  # an allocated variant's device is excluded by name

    def with_spares(
        self, specs: Pools, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        spares: Mapping[str, Variant],
    ) -> tuple[Pools, dict[str, Variant]]:  # fmt: skip
        # A spare's variant is in the pool already; one its node names by its
        # memdev (a CXL LD) is renamed so (``variant.as_memdev``).
        return (renamed(specs[0], spares), *specs[1:]), dict(spares)


class SlotPool:
    """Model slots: the manager picks the device (docs/fabric.md, "Count-based managers")."""

    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
        served: Mapping[str, str], node_objects: Iterable[Mapping[str, Any]],
    ) -> tuple[Pools, dict[str, Variant]]:  # fmt: skip
        # A slot is charged to the switch of the device that arrived for it.
        mine_ = mine(pinned, pool)
        spec, variants = build_count_pool(pool, inventory, nodes, excluded, mine_, carried, served)
        return (spec,), variants

    def findings(self) -> tuple[LabelFinding, ...]:
        return ()

    def holds_back(self) -> bool:
        return False

    def place(
        self, v: Variant, a: cl.FabricAllocation, inv: FabricInventory,
        reports: Mapping[str, NodeFabric],
    ) -> Variant:  # fmt: skip
        return v  # a slot per node and adapter

    def device_of(self, v: Variant, served: str) -> str:
        return served if v.count else v.device_id

    def take_up(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric], allocs: Allocations,
        variants: Mapping[str, Variant], workers: slot_serving.Serving,
        stored: Iterable[Mapping[str, Any]], spares: Collection[str],
    ) -> None:  # fmt: skip
        # What arrived before a restart is followed, not detached; spares are not.
        published = slot_spares.stored_spares(stored) | set(spares)
        slot_serving.take_up(inv, reports, allocs, variants, workers, published)

    def models(self, variants: Iterable[Variant]) -> dict[str, str]:
        return slot_spares.slot_models(variants)

    def shortfall(
        self, inv: FabricInventory, allocs: Allocations, variants: Mapping[str, Variant],
        served: Callable[[cl.FabricAllocation], str], in_use: Collection[str],
        leaving: Callable[[str], bool],
    ) -> tuple[set[str], set[str]]:  # fmt: skip
        return slot_spares.shortfall(inv, allocs, variants, served, in_use, leaving)

    def with_spares(
        self, specs: Pools, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        spares: Mapping[str, Variant],
    ) -> tuple[Pools, dict[str, Variant]]:  # fmt: skip
        # A count pool has no device variants: a ready spare's is added.
        spec, shown = slot_spares.spare_variants(specs[0], inv, spares)
        return (spec, *specs[1:]), shown


def renamed(spec: PoolSpec, spares: Mapping[str, Variant]) -> PoolSpec:
    """``spec`` with each spare's variant on its node under the spare's name
    (with the memdev it is attached as), where that differs."""
    where = {(v.device_id, v.node, v.adapter): v for v in spares.values() if v.memdev}
    if not where:
        return spec
    devices, slice_of = [], dict(spec.slice_of or {})
    for d in spec.devices:
        a = d.attributes
        v = where.get((str(a.get("fabricDevice")), d.node_name or "", str(a.get("fabricAdapter"))))
        if v is not None and v.name != d.name:
            slice_of[v.name] = slice_of.pop(d.name)
            d = dataclasses.replace(
                d, name=v.name, attributes={**a, PCI_BUS_ID: cxl_bdf_of(v.memdev)}
            )
        devices.append(d)
    return dataclasses.replace(spec, devices=tuple(devices), slice_of=slice_of)


def mine(pinned: Mapping[str, str], pool: str) -> set[str]:
    """The allocated variants of ``pool`` (the others are another shape's)."""
    return {name for name, p in pinned.items() if p == pool}


def pool_model(picks_devices: bool, shape: str) -> PoolModel:
    """The pool's shape for a fabric whose manager picks the device (or not),
    and the ``fabric_pool_shape`` setting."""
    if picks_devices:
        return DomainSlotPool() if shape == "per-domain" else SlotPool()
    return DomainPool() if shape == "per-domain" else DevicePool()
