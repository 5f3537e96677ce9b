"""How the fabric pool's devices are laid out in slices and shown as spares.

Why a module: both pool shapes (``driver.controller.pool.devices`` and
``driver.controller.pool.slots``) and the spares a count pool adds
(``driver.controller.pool.slot_spares``) lay their devices out the same
way, written here once.

Layout: node-major, one node's variants per slice (cut again only past 64
devices). The scheduler skips a slice for a node when none of its devices
sits on that node, and otherwise evaluates the class's CEL selectors on every
device before checking its node; with GPU-major slices every node has a
device in every slice, so every claim in the cluster paid for the whole
pool (``tests/bench/sched_bench.py``: 4096 variants, 383 ms scheduler CPU
per local-GPU pod GPU-major, 125 ms node-major). A GPU-major layout's other
promise, one GPU's change rewriting one slice, does not hold anyway: any
change rewrites every slice of the pool at a new generation (API rule).

A ready warm spare (``driver.controller.spares``) is shown as such:
``spare: true``, no binding conditions. Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable

from driver import DRIVER_NAME
from driver.devices.model import CounterSet, Device
from driver.fabric_devices.naming import SPARE_ATTRIBUTE
from driver.slices.build import PoolSpec, slice_name_prefix


def by_node(device: Device) -> tuple[str, str]:
    """The default order within the layout: node, then device name."""
    return (device.node_name or "", device.name)


def node_major(
    pool: str,
    devices: Iterable[Device],
    counter_sets: Iterable[CounterSet],
    order: Callable[[Device], tuple[str, str]] = by_node,
) -> PoolSpec:
    """The pool spec of ``devices`` (each on one node), one node's per slice;
    ``order``: their order, node first."""
    ordered = sorted(devices, key=order)
    index = {n: i for i, n in enumerate(sorted({d.node_name or "" for d in ordered}))}
    return PoolSpec(
        driver=DRIVER_NAME,
        pool_name=pool,
        name_prefix=slice_name_prefix(pool, DRIVER_NAME),
        node_selection={"perDeviceNodeSelection": True},
        devices=tuple(ordered),
        counter_sets=tuple(counter_sets),
        slice_of={d.name: index[d.node_name or ""] for d in ordered},
    )


def mark_spares(spec: PoolSpec, names: Collection[str]) -> PoolSpec:
    """``spec`` with the variants ``names`` (ready warm spares) as spares:
    ``spare: true``, no binding conditions (the device is there already);
    the same counter, so the device's other variants stay exclusive of it."""
    if not names:
        return spec
    devices = tuple(
        dataclasses.replace(
            d,
            attributes={**d.attributes, SPARE_ATTRIBUTE: True},
            binds_to_node=False,
            binding_conditions=(),
            binding_failure_conditions=(),
        )
        if d.name in names
        else d
        for d in spec.devices
    )
    return dataclasses.replace(spec, devices=devices)
