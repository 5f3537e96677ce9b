"""Warm spares on a count-based manager's fabric: ask for a model, keep what arrives.

Why a module: the spare policy (``driver.controller.spares.policy``) works per node
and model, which a count-based manager serves as is; what differs is the
device. The keeper asks "one X for node N" through a free device of model X
(which only names the model) and keeps whatever the manager attached
(``count_attach.ask_spare``, ``Workers.attach_spare``). A count pool has no
device variants, only model slots (``driver.controller.pool.slots``); a
ready spare is published as its own device variant on its node (the node
plugin knows that name: the device is attached there), with ``spare: true``,
no binding conditions, consuming one unit of its switch-and-model counter
like a slot. A pod that takes it binds at once, and its attach adopts the
connection as for any spare.

Exclusivity: a slot and the spare's variant are different devices to the
scheduler, so a slot is never served by a published spare
(``count_attach.take_up`` skips them); instead, when the waiting slots of a
switch and model outnumber its devices that are not attached, the newest
spares of that switch and model are released (:func:`shortfall`) and the
free devices are reserved for those slots, not attached as new spares. Pure
functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from driver.controller import claims as cl
from driver.controller.pool.layout import node_major
from driver.controller.pool.slots import Group, slot_group
from driver.controller.pool.variant import Variant, offered, variant_device
from driver.devices.model import CounterConsumption, Device
from driver.fabric_devices.naming import SPARE_ATTRIBUTE, counter_name
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec


def slot_models(variants: Iterable[Variant]) -> dict[str, str]:
    """Slot id -> its model (what a demand rule for the slot's model matches)."""
    return {v.device_id: slot_group(v.device_id)[1] for v in variants if v.count}


def spare_variants(
    spec: PoolSpec, inv: FabricInventory, spares: Mapping[str, Variant]
) -> tuple[PoolSpec, dict[str, Variant]]:
    """``spec`` with the ready spares' variants ``spares`` added, each
    consuming its switch-and-model counter (``pool.mark_spares`` then drops
    their binding conditions); the added variants by name."""
    have = {d.name for d in spec.devices}
    counter_set = {c: s.name for s in spec.counter_sets for c, _ in s.counters}
    added: list[Device] = []
    variants: dict[str, Variant] = {}
    by_id = {d.id: d for d in inv.devices}
    for v in sorted(spares.values(), key=lambda v: (v.device_id, v.name)):
        d = by_id.get(v.device_id)
        if d is not None and v.name not in have:
            counter = counter_name(f"{d.switch}-{d.model}")
            where = counter_set.get(counter)
            use = (CounterConsumption(where, ((counter, "1"),)),) if where else ()
            added.append(dataclasses.replace(variant_device(d, v, ""), consumes_counters=use))
            variants[v.name] = v
    if not added:
        return spec, variants
    laid = node_major(spec.pool_name, (*spec.devices, *added), spec.counter_sets)
    return dataclasses.replace(spec, devices=laid.devices, slice_of=laid.slice_of), variants


def stored_spares(slices: Iterable[Mapping[str, Any]]) -> set[str]:
    """The fabric devices whose variant the stored pool shows as a spare (a
    scheduler may allocate it now): no slot is served by them."""
    out = set()
    for obj in slices:
        for raw in (obj.get("spec") or {}).get("devices") or ():
            attrs = raw.get("attributes") or {}
            device = (attrs.get("fabricDevice") or {}).get("string")
            if (attrs.get(SPARE_ATTRIBUTE) or {}).get("bool") and device:
                out.add(str(device))
    return out


def shortfall(
    inv: FabricInventory,
    allocs: Iterable[cl.FabricAllocation],
    variants: Mapping[str, Variant],
    served: Callable[[cl.FabricAllocation], str],
    in_use: Collection[str],
    leaving: Callable[[str], bool],
) -> tuple[set[str], set[str]]:
    """(free devices reserved for waiting slots, attached devices to release for them).

    A slot allocation waits while no device serves it; the manager serves it
    from the devices of its switch and model that are not attached. Those
    are reserved (no spare takes them), and where the waiting slots outnumber
    them, as many attached devices of that switch and model that no
    allocation uses are released: those already ``leaving`` (a detach under
    way) first, then spares.
    """
    waiting: dict[Group, int] = {}
    for a in allocs:
        v = variants.get(a.device)
        if v is None or not v.count or a.ready or a.failed or served(a):
            continue
        switch, model = slot_group(v.device_id)
        waiting[(switch, v.kind, model)] = waiting.get((switch, v.kind, model), 0) + 1
    unattached: dict[Group, list[str]] = {}
    idle: dict[Group, list[str]] = {}
    for d in sorted(inv.devices, key=lambda d: (not leaving(d.id), d.id)):
        group: Group = (d.switch, d.kind, d.model)
        if group not in waiting or not offered(d) or d.id in in_use:
            continue
        (idle if d.connection else unattached).setdefault(group, []).append(d.id)
    release: set[str] = set()
    for g, n in waiting.items():
        release.update(idle.get(g, [])[: max(n - len(unattached.get(g, ())), 0)])
    return {d for ids in unattached.values() for d in ids}, release
