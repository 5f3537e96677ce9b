"""A count-based manager's model slots published once per reach domain.

Why a module: the per-node count pool (``driver.controller.pool.slots``)
offers, for every node and adapter, as many slots as that adapter reaches
free devices of a model, and keeps them exclusive with a counter per switch
and model: it grows with the cluster as the per-node device pool does. In
the per-domain shape (``fabric_pool_shape: per-domain``) each slot is
published once, in its reach domain's pool (``<fabric_pool>/<domain>``,
``driver.controller.pool.domain_pool``'s pools and selectors): for each
switch and model of a domain, as many slots as the switch has devices of
that model, less those that allocations and ready spares there hold. So no
counter is needed (the slots not allocated are exactly what the manager can
still attach) and a slice holds up to 128 of them. A slot has no node, no
adapter and no root until an allocation names its node: :func:`placed` picks
the node's reported adapter that reaches a free device of the slot's switch
and model (the manager then picks the device, ``driver.controller.attach.slot_attach``).

Slots of a group are named by index (``<switch>/<model>/<pool key>//<i>``);
the ones not allocated are the lowest free indices, so a name the scheduler
may be about to allocate seldom changes. An allocated slot stays published
as last published until deallocated. A ready warm spare leaves a slot of
its group (the highest free one) and is published in its node's spare pool
(``driver.controller.pool.spare_pools``) once the stored domain pool no
longer holds that slot, so the scheduler never sees more offers than
devices. Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from driver import DRIVER_NAME
from driver.controller.pool.domain_pool import pool_name
from driver.controller.pool.domains import (
    DOMAIN_ATTRIBUTE,
    Domain,
    LabelFinding,
    findings,
    labelled,
    reach_domains,
    reaching,
    selector,
)
from driver.controller.pool.slots import SLOT_ATTRIBUTE, build_count_pool, slot_group, slot_id
from driver.controller.pool.variant import Variant, offered
from driver.devices.model import ATTACHMENT, AttributeValue, Device
from driver.fabric_devices.naming import (
    FABRIC_KIND,
    FAILED_CONDITION,
    PUBLISHED_TYPE,
    READY_CONDITION,
    SPARE_ATTRIBUTE,
    NodeFabric,
    device_name,
)
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.slices.build import PoolSpec, slice_name_prefix

Group = tuple[str, str, str, str]  # (pool, switch, kind, model)


def domain_slot_id(pool: str, base: str, switch: str, model: str, i: int) -> str:
    """A slot's id: unique in the cluster, parsed by ``slots.slot_group``."""
    return slot_id(switch, model, pool[len(base) + 1 :].replace("/", "."), "", i)


def slot_device(slot: str, group: Group, first: FabricDevice, domain: str) -> Device:
    _, switch, kind, model = group
    attrs: dict[str, AttributeValue] = {
        "productName": model,
        ATTACHMENT: "fabric",
        SLOT_ATTRIBUTE: slot,
        "fabricSwitch": switch,
        DOMAIN_ATTRIBUTE: domain,
        SPARE_ATTRIBUTE: False,
    }
    if kind == "gpu":
        attrs |= {"pciVendorID": f"{first.vendor_id:04x}", "pciDeviceID": f"{first.device_id:04x}"}
    return Device(
        name=device_name(slot, kind),
        kind=PUBLISHED_TYPE[kind],
        local_id=slot,
        attributes=attrs,
        binds_to_node=True,
        binding_conditions=(READY_CONDITION,),
        binding_failure_conditions=(FAILED_CONDITION,),
    )


def carried_slot(device: Device) -> Variant | None:
    """The unplaced slot a device of a domain pool stands for (None if not one)."""
    slot = device.attributes.get(SLOT_ATTRIBUTE)
    if device.node_name or not isinstance(slot, str) or not slot:
        return None
    kind = FABRIC_KIND.get(device.kind, "nic")
    return Variant(device.name, slot, kind, slot, "", "", "", count=True, once=True)


@dataclasses.dataclass
class DomainSlots:
    """What one build publishes: the pools, their slot variants, and per
    group the slots not allocated (highest last: a spare takes those first)."""

    pools: list[PoolSpec]
    variants: dict[str, Variant]
    free: dict[Group, list[str]]
    group_of: dict[str, Group]  # fabric device id -> its group
    found: list[LabelFinding]


def build_domain_slots(
    base: str, inventory: FabricInventory, reports: Mapping[str, NodeFabric],
    nodes: Iterable[Mapping[str, Any]], excluded: Collection[str], pinned: Mapping[str, str],
    carried: Mapping[str, Device], served: Mapping[str, str],
) -> DomainSlots:  # fmt: skip
    """Every domain pool of slots (arguments as ``domain_pool.build_domain_pools``'s;
    ``excluded`` holds slot ids after a failed attach; ``served``: allocated
    slot -> the device that arrived for it)."""
    by_id = {d.id: d for d in inventory.devices}
    nodes = list(nodes)
    members: dict[Group, list[FabricDevice]] = {}
    selectors: dict[str, dict[str, Any]] = {}
    domain_of: dict[str, str] = {}
    group_of: dict[str, Group] = {}  # device id -> its group
    found: list[LabelFinding] = []
    for dom in reach_domains(inventory):
        reach = {i: reaching(by_id[i], reports) for i in dom.devices}
        marked = labelled(nodes, dom)
        found += findings(dom, reach, marked)
        everywhere = marked - set().union(*reach.values())
        for i in dom.devices:
            d = by_id[i]
            cut = marked - reach[i]
            pool = pool_name(base, dom.name, cut - everywhere)
            group_of[i] = (pool, d.switch, d.kind, d.model)
            if offered(d):
                selectors[pool], domain_of[pool] = selector(dom, cut), dom.name
                members.setdefault(group_of[i], []).append(d)
    held: dict[Group, int] = {}  # allocations charged to each group
    kept: dict[str, list[Device]] = {}
    variants: dict[str, Variant] = {}
    slots = set()
    for name, pool in sorted(pinned.items()):
        old = carried.get(name)
        v = carried_slot(old) if old is not None and pool.startswith(base + "/") else None
        if old is None or v is None:
            continue
        slots.add(name)
        switch, model = slot_group(v.device_id)
        group = group_of.get(served.get(name, ""), (pool, switch, v.kind, model))
        held[group] = held.get(group, 0) + 1
        if v.device_id not in excluded:
            kept.setdefault(pool, []).append(old)
            variants[name] = v
    for name in pinned.keys() - slots:  # a legacy slot or a taken spare: its device's
        if (holds := served.get(name, "")) in group_of:
            held[group_of[holds]] = held.get(group_of[holds], 0) + 1
    grouped: dict[str, list[Device]] = {p: list(ds) for p, ds in kept.items()}
    free: dict[Group, list[str]] = {}
    for group, devs in sorted(members.items()):
        pool, switch, kind, model = group
        want, n = len(devs) - held.get(group, 0), 0
        while want > 0:
            slot = domain_slot_id(pool, base, switch, model, n)
            dev = slot_device(slot, group, devs[0], domain_of[pool])
            n += 1
            if dev.name in slots:  # allocated: published above
                continue
            want -= 1
            if slot in excluded:  # held after a failed attach: one fewer offered
                continue
            grouped.setdefault(pool, []).append(dev)
            if dev.name not in pinned:  # else allocated, never published as such before
                free.setdefault(group, []).append(dev.name)
            variants[dev.name] = Variant(dev.name, slot, kind, slot, "", "", "",
                                         count=True, once=True)  # fmt: skip
    pools = [
        PoolSpec(
            driver=DRIVER_NAME,
            pool_name=pool,
            name_prefix=slice_name_prefix(pool.replace("/", "."), DRIVER_NAME),
            node_selection=selectors.get(pool) or selector_of(base, pool),
            devices=tuple(sorted(devices, key=lambda d: str(d.attributes[SLOT_ATTRIBUTE]))),
        )
        for pool, devices in sorted(grouped.items())
    ]
    return DomainSlots(pools, variants, free, group_of, found)


def selector_of(base: str, pool: str) -> dict[str, Any]:
    """A pool no device offers any more (only allocated slots left): its domain's label."""
    return selector(Domain(pool[len(base) + 1 :].split("/")[0], ()), ())


def legacy_slots(
    base: str, inventory: FabricInventory, reports: Mapping[str, NodeFabric],
    excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
    served: Mapping[str, str],
) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:  # fmt: skip
    """Upgrade from the per-node shape: the slots allocated from ``base``
    itself stay published there (with their counters), and only they, until
    deallocated."""
    legacy = {n for n, p in pinned.items() if p == base}
    if not legacy:
        return (), {}
    spec, variants = build_count_pool(base, inventory, reports, excluded, legacy, carried, served)
    keep = tuple(d for d in spec.devices if d.name in legacy)
    used = {c.counter_set for d in keep for c in d.consumes_counters}
    sets = tuple(c for c in spec.counter_sets if c.name in used)
    spec = dataclasses.replace(spec, devices=keep, counter_sets=sets)
    return (spec,), {n: variants[n] for n in legacy if n in variants}


def placed(
    v: Variant, node: str, inv: FabricInventory, reports: Mapping[str, NodeFabric]
) -> Variant:
    """Slot ``v`` on ``node`` (the one the scheduler picked): through the
    node's first reported adapter that reaches a free device of the slot's
    switch and model, else the first that reaches one at all; no adapter
    ("") when none does (the attach then fails, naming the node)."""
    if v.node:
        return v
    switch, model = slot_group(v.device_id)
    report = reports.get(node) or NodeFabric()
    free: set[str] = set()
    reach: set[str] = set()
    for d in inv.devices:
        if (d.switch, d.kind, d.model) != (switch, v.kind, model):
            continue
        ours = {a.adapter for a in d.adapters if a.node == node and a.adapter in report.adapters}
        reach |= ours
        if d.connection is None:
            free |= ours
    adapter = min(free or reach or {""})
    return dataclasses.replace(v, node=node, adapter=adapter, root=report.adapters.get(adapter, ""))


def stored_names(base: str, stored: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Pool -> the device names its stored slices hold (the fabric family's pools)."""
    out: dict[str, set[str]] = {}
    for obj in stored:
        pool = str(((obj.get("spec") or {}).get("pool") or {}).get("name") or "")
        if pool.startswith(base + "/"):
            names = {str(raw.get("name")) for raw in (obj.get("spec") or {}).get("devices") or ()}
            out.setdefault(pool, set()).update(names)
    return out


def trim_for_spares(
    specs: tuple[PoolSpec, ...], built: DomainSlots, ready: Iterable[Variant],
    stored: Mapping[str, set[str]],
) -> tuple[tuple[PoolSpec, ...], set[str]]:  # fmt: skip
    """``specs`` less one free slot of each ready spare's group (the highest),
    and the spares' devices that must wait: their group's stored pool still
    holds a slot no longer declared (the scheduler could see both)."""
    drop: set[str] = set()
    pools: dict[str, str] = {}  # spare device -> its group's pool
    for v in sorted(ready, key=lambda v: v.name):
        group = built.group_of.get(v.device_id)
        if group is None:
            continue
        pools[v.device_id] = group[0]
        left = [n for n in built.free.get(group, ()) if n not in drop]
        if left:
            drop.add(left[-1])
    out = tuple(
        dataclasses.replace(s, devices=tuple(d for d in s.devices if d.name not in drop))
        for s in specs
    )
    declared = {s.pool_name: {d.name for d in s.devices} for s in out}
    waiting = {d for d, p in pools.items() if stored.get(p, set()) - declared.get(p, set())}
    return out, waiting
