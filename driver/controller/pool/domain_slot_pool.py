"""The pool model of a count-based manager's slots published once per reach domain.

Why a module: the reconciler holds one :class:`~driver.controller.pool.model.PoolModel`
and never asks which; this is the one for a manager that picks the device
(``picks_devices``) under ``fabric_pool_shape: per-domain``. What the slots
are and how they are laid out is ``driver.controller.pool.domain_slots``;
here they are placed on the node an allocation names, what is attached
already is taken up as for the per-node slots
(``driver.controller.pool.slot_serving``), and ready warm spares go to
their node's pool (``driver.controller.pool.spare_pools``), each taking a
free slot of its group out of the domain pool first.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from driver.controller import claims as cl
from driver.controller.pool import slot_serving, slot_spares
from driver.controller.pool.domain_slots import (
    DomainSlots,
    build_domain_slots,
    legacy_slots,
    placed,
    stored_names,
    trim_for_spares,
)
from driver.controller.pool.domains import LabelFinding
from driver.controller.pool.spare_pools import spare_pools, taken_spares
from driver.controller.pool.variant import Variant
from driver.devices.model import Device
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec


class DomainSlotPool:
    """:class:`~driver.controller.pool.model.PoolModel` for a count-based
    manager with each slot once, in a pool per reach domain."""

    def __init__(self) -> None:
        self._base = ""
        self._built = DomainSlots([], {}, {}, {}, [])
        self._stored: dict[str, set[str]] = {}
        self._held_back = False

    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
        served: Mapping[str, str], node_objects: Iterable[Mapping[str, Any]],
    ) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:  # fmt: skip
        self._base = pool
        legacy, kept = legacy_slots(pool, inventory, nodes, excluded, pinned, carried, served)
        taken, took = taken_spares(pool, pinned, carried)
        built = build_domain_slots(
            pool, inventory, nodes, node_objects, excluded, pinned, carried, served
        )
        self._built = built
        return (*legacy, *built.pools, *taken), built.variants | kept | took

    def findings(self) -> tuple[LabelFinding, ...]:
        return tuple(self._built.found)

    def holds_back(self) -> bool:
        return self._held_back

    def place(
        self, v: Variant, a: cl.FabricAllocation, inv: FabricInventory,
        reports: Mapping[str, NodeFabric],
    ) -> Variant:  # fmt: skip
        return placed(v, a.node, inv, reports)

    def device_of(self, v: Variant, served: str) -> str:
        return served if v.count else v.device_id

    def take_up(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        allocs: Iterable[cl.FabricAllocation], variants: Mapping[str, Variant],
        workers: slot_serving.Serving, stored: Iterable[Mapping[str, Any]],
        spares: Collection[str],
    ) -> None:  # fmt: skip
        stored = list(stored)
        self._stored = stored_names(self._base, stored)
        allocs = list(allocs)
        where = {a.device: placed(variants[a.device], a.node, inv, reports)
                 for a in allocs if a.device in variants}  # fmt: skip
        published = slot_spares.stored_spares(stored) | set(spares)
        slot_serving.take_up(inv, reports, allocs, {**variants, **where}, workers, published)

    def models(self, variants: Iterable[Variant]) -> dict[str, str]:
        return slot_spares.slot_models(variants)

    def shortfall(
        self, inv: FabricInventory, allocs: Iterable[cl.FabricAllocation],
        variants: Mapping[str, Variant], served: Callable[[cl.FabricAllocation], str],
        in_use: Collection[str], leaving: Callable[[str], bool],
    ) -> tuple[set[str], set[str]]:  # fmt: skip
        return slot_spares.shortfall(inv, allocs, variants, served, in_use, leaving)

    def with_spares(
        self, specs: tuple[PoolSpec, ...], inv: FabricInventory,
        reports: Mapping[str, NodeFabric], spares: Mapping[str, Variant],
    ) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:  # fmt: skip
        specs, waiting = trim_for_spares(specs, self._built, spares.values(), self._stored)
        out, shown, held = spare_pools(self._base, specs, inv, spares, waiting)
        self._held_back = held
        return out, shown
