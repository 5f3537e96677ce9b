"""The fabric pool's shape: the :class:`PoolModel` protocol and its two implementations.

Why a module: what the pool offers depends on who picks the device. A
manager that attaches the device it is asked for gets a variant per device
(:class:`DevicePool`, ``driver.controller.pool.devices``); a count-based
manager, which attaches "one of model X" and picks the device itself, gets
model slots (:class:`SlotPool`, ``driver.controller.pool.slots``), with
what follows from that: the device a slot allocation holds is the one that
arrived for it, what is attached already is taken up
(``driver.controller.pool.slot_serving``), and warm spares are published as
device variants that must give way to waiting slots
(``driver.controller.pool.slot_spares``). The reconciler holds one model
(:func:`pool_model`, from the fabric client's ``picks_devices``) and never
asks which. Pure, except ``take_up``, which tells the workers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from driver.controller import claims as cl
from driver.controller.pool import slot_serving, slot_spares
from driver.controller.pool.devices import build_pool
from driver.controller.pool.slots import build_count_pool
from driver.controller.pool.variant import Variant
from driver.devices.model import Device
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec

Allocations = Iterable[cl.FabricAllocation]


class PoolModel(Protocol):
    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Collection[str], carried: Mapping[str, Device],
        served: Mapping[str, str],
    ) -> tuple[PoolSpec, dict[str, Variant]]:  # fmt: skip
        """The pool spec and its variants by name (``devices.build_pool``'s
        arguments; ``served``: allocated variant -> the device it holds)."""
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
        self, spec: PoolSpec, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        names: Collection[str],
    ) -> tuple[PoolSpec, dict[str, Variant]]:  # fmt: skip
        """``spec`` with the ready spares ``names`` published; the variants added."""
        ...


class DevicePool:
    """A variant per device: every device is offered by name, spares included."""

    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Collection[str], carried: Mapping[str, Device],
        served: Mapping[str, str],
    ) -> tuple[PoolSpec, dict[str, Variant]]:  # fmt: skip
        return build_pool(pool, inventory, nodes, excluded, pinned, carried)

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
        self, spec: PoolSpec, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        names: Collection[str],
    ) -> tuple[PoolSpec, dict[str, Variant]]:  # fmt: skip
        return spec, {}  # a spare's variant is in the pool already


class SlotPool:
    """Model slots: the manager picks the device (docs/fabric.md, "Count-based managers")."""

    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Collection[str], carried: Mapping[str, Device],
        served: Mapping[str, str],
    ) -> tuple[PoolSpec, dict[str, Variant]]:  # fmt: skip
        # A slot is charged to the switch of the device that arrived for it.
        return build_count_pool(pool, inventory, nodes, excluded, pinned, carried, served)

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
        self, spec: PoolSpec, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        names: Collection[str],
    ) -> tuple[PoolSpec, dict[str, Variant]]:  # fmt: skip
        # A count pool has no device variants: a ready spare's is added.
        return slot_spares.spare_variants(spec, inv, reports, names)


def pool_model(picks_devices: bool) -> PoolModel:
    """The pool's shape for a fabric whose manager picks the device (or not)."""
    return SlotPool() if picks_devices else DevicePool()
