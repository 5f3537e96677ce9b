"""The fabric pool with each device published once, in a pool per reach domain.

Why a module: the per-node shape (``driver.controller.pool.devices``)
publishes a variant per device and node, so the pool grows with the cluster
and looks incomplete from every node, which costs the scheduler every slice
in the cluster for every node it tries (docs/scale.md). Here each physical
device is one entry with ``bindsToNode`` and the binding conditions of
today, and no root or adapter (it has neither until it is attached: the
controller attaches through an adapter of the node the scheduler picked).
Reach stays the scheduler's: each reach domain
(``driver.controller.pool.domains``) is a pool of its own,
``<fabric_pool>/<domain>``, whose slices (at most 128 devices each: no
counters; 64 once a failed device is tainted, ``driver.controller.health``)
all select the domain's labelled Nodes, so the pool is
complete from every node that can use it. A labelled Node that a device's
adapters do not reach is cut out by name; when only some of a domain's
devices miss it (zones), those devices go to a pool of their own,
``<fabric_pool>/<domain>/<hash of those missing>``, so every slice of a pool
keeps one selector (a labelled Node that reaches none of the domain is cut
from all its pools, which keep their names).

An allocated device stays in the pool it was allocated from until it is
deallocated, taken from the devices published before (``carried``) when the
inventory no longer shows it: the scheduler counts an allocation by pool and
name, and the same device under another name would be free to it. Pure.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver import DRIVER_NAME
from driver.controller import claims as cl
from driver.controller.pool.adapter_pools import adapter_pools, claimed_adapters
from driver.controller.pool.devices import build_pool
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
from driver.controller.pool.room import full_adapters, full_nodes
from driver.controller.pool.spare_pools import in_domain_pools, spare_pools, taken_spares
from driver.controller.pool.variant import Variant, fabric_attributes, offered
from driver.devices.model import Device
from driver.fabric_devices.naming import (
    FABRIC_KIND,
    FAILED_CONDITION,
    IDENTITY_ATTRIBUTE,
    PUBLISHED_TYPE,
    READY_CONDITION,
    NodeFabric,
    device_name,
    in_fabric_pool,
)
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.slices.build import PoolSpec, slice_name_prefix


@dataclass(frozen=True)
class DomainPools:
    """What one build publishes: the pools, their devices as variants (no node
    yet), the Nodes whose reach label disagrees with their adapters, and the
    nodes' adapter pools."""

    pools: tuple[PoolSpec, ...]
    variants: dict[str, Variant] = field(default_factory=dict)
    findings: tuple[LabelFinding, ...] = ()
    adapters: tuple[PoolSpec, ...] = ()  # the nodes' adapter pools (pairings)


def pool_name(base: str, domain: str, cut: Collection[str]) -> str:
    if not cut:
        return f"{base}/{domain}"
    return f"{base}/{domain}/{hashlib.sha256(','.join(sorted(cut)).encode()).hexdigest()[:8]}"


def domain_device(device: FabricDevice, domain: str) -> Device:
    attrs, capacity = fabric_attributes(device)
    attrs[DOMAIN_ATTRIBUTE] = domain
    return Device(
        name=device_name(device.unique_identity, device.kind),
        kind=PUBLISHED_TYPE[device.kind],
        local_id=device.identity,
        attributes=attrs,
        capacity=capacity,
        binds_to_node=True,
        binding_conditions=(READY_CONDITION,),
        binding_failure_conditions=(FAILED_CONDITION,),
    )


def unplaced(name: str, device_id: str, kind: str, identity: str) -> Variant:
    """A device of a domain pool as a variant: no node, adapter or root until
    an allocation names its node."""
    return Variant(name, device_id, kind, identity, "", "", "", once=True)


def carried_variant(device: Device) -> Variant | None:
    """The variant a device published in a domain pool stands for (None if not one)."""
    kind = FABRIC_KIND.get(device.kind, "nic")
    dev_id = device.attributes.get("fabricDevice")
    ident = device.attributes.get(IDENTITY_ATTRIBUTE[kind])
    if not isinstance(dev_id, str) or not isinstance(ident, str) or not dev_id or not ident:
        return None
    return unplaced(device.name, dev_id, kind, ident)


def build_domain_pools(
    base: str,
    inventory: FabricInventory,
    reports: Mapping[str, NodeFabric],
    nodes: Iterable[Mapping[str, Any]],
    excluded: Collection[str],
    pinned: Mapping[str, str],
    carried: Mapping[str, Device],
) -> DomainPools:
    """Every domain pool of ``inventory``.

    ``excluded``: device ids kept out (a failed attach's hold); ``pinned``:
    allocated device name -> the pool it was allocated from; ``carried``:
    the devices published before, by name.
    """
    by_id = {d.id: d for d in inventory.devices}
    nodes = list(nodes)
    grouped: dict[str, list[Device]] = {}
    selectors: dict[str, dict[str, Any]] = {}
    variants: dict[str, Variant] = {}
    found: list[LabelFinding] = []
    domains = reach_domains(inventory)
    no_room = full_adapters(inventory)
    for dom in domains:
        reach = {i: reaching(by_id[i], reports) for i in dom.devices}
        marked = labelled(nodes, dom)
        found += findings(dom, reach, marked)
        # Nodes labelled with no reach at all, or whose adapters into the domain
        # have no room (pool.room), are cut from every pool of the domain; only
        # a device some labelled node misses gets a pool of its own.
        full = full_nodes((by_id[i] for i in dom.devices), reports, no_room) & marked
        everywhere = (marked - set().union(*reach.values())) | full
        for i in dom.devices:
            d = by_id[i]
            name = device_name(d.unique_identity, d.kind)
            if i in excluded or not (offered(d) or name in pinned):
                continue
            cut = (marked - reach[i]) | full
            here = pool_name(base, dom.name, cut - everywhere)
            selectors[here] = selector(dom, cut)
            grouped.setdefault(pinned.get(name, here), []).append(domain_device(d, dom.name))
            variants[name] = unplaced(name, d.id, d.kind, d.identity)
    for name, pool in sorted(pinned.items()):  # allocated, no longer in the inventory
        old = carried.get(name)
        v = carried_variant(old) if old is not None and name not in variants else None
        ours = pool != base and in_fabric_pool(pool, base)
        if ours and old is not None and v is not None and v.device_id not in excluded:
            grouped.setdefault(pool, []).append(old)
            variants[name] = v
    specs = []
    for pool, devices in sorted(grouped.items()):
        domain = Domain(pool[len(base) + 1 :].split("/")[0], ())
        specs.append(
            PoolSpec(
                driver=DRIVER_NAME,
                pool_name=pool,
                name_prefix=slice_name_prefix(pool.replace("/", "."), DRIVER_NAME),
                node_selection=selectors.get(pool) or selector(domain, ()),
                devices=tuple(sorted(devices, key=lambda x: str(x.attributes["fabricDevice"]))),
            )
        )
    adapters = adapter_pools(base, inventory, domains, reports)
    return DomainPools(tuple(specs), variants, tuple(found), adapters)


def carried_pool(
    pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
    excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:  # fmt: skip
    """Upgrade from the per-node shape: the variants claims were allocated from
    ``pool`` itself (before the shape changed) stay published there, and only
    they, until deallocated; their devices are in no domain pool meanwhile.
    No pool when there is none."""
    legacy = {n for n, p in pinned.items() if p == pool}
    if not legacy:
        return (), {}
    spec, variants = build_pool(pool, inventory, nodes, excluded, legacy, carried)
    keep = tuple(d for d in spec.devices if d.name in legacy)
    used = {c.counter_set for d in keep for c in d.consumes_counters}
    sets = tuple(c for c in spec.counter_sets if c.name in used)
    spec = dataclasses.replace(spec, devices=keep, counter_sets=sets)
    return (spec,), {n: variants[n] for n in legacy if n in variants}


def placed(
    v: Variant, node: str, inv: FabricInventory, reports: Mapping[str, NodeFabric],
    claimed: Collection[str] = (),
) -> Variant:  # fmt: skip
    """``v`` on ``node`` (the one the scheduler picked), through the adapter
    there that it is bound to already, else the first of the node's reported
    adapters that reaches it; with no adapter ("") when none does (the
    attach then fails, naming the node). ``claimed``: the node's adapters the
    claim was allocated (a pairing, ``driver.controller.pool.adapter_pools``):
    then only through one of them, and with none that reaches it the attach
    fails naming them (``why``)."""
    if v.node:
        return v
    report = reports.get(node) or NodeFabric()
    device = next((d for d in inv.devices if d.id == v.device_id), None)
    conn = device.connection if device is not None else None
    reach = sorted(a.adapter for a in (device.adapters if device else ()) if a.node == node)
    usable = [x for x in reach if x in report.adapters and (not claimed or x in claimed)]
    if conn is not None and conn.node == node and conn.adapter in usable:
        adapter = conn.adapter
    else:
        adapter = usable[0] if usable else ""
    why = ""
    if claimed and not adapter:
        named = ", ".join(sorted(claimed))
        why = f"the claim's fabric adapter {named} on node {node} does not reach {v.device_id}"
    root = report.adapters.get(adapter, "")
    return dataclasses.replace(v, node=node, adapter=adapter, root=root, why=why)


class DomainPool:
    """:class:`~driver.controller.pool.model.PoolModel` with each device once,
    in a pool per reach domain."""

    def __init__(self) -> None:
        self._findings: tuple[LabelFinding, ...] = ()
        self._base = ""
        self._in_domains: set[str] = set()
        self._held_back = False

    def build(
        self, pool: str, inventory: FabricInventory, nodes: Mapping[str, NodeFabric],
        excluded: Collection[str], pinned: Mapping[str, str], carried: Mapping[str, Device],
        served: Mapping[str, str], node_objects: Iterable[Mapping[str, Any]],
    ) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:  # fmt: skip
        self._base = pool
        legacy, kept = carried_pool(pool, inventory, nodes, excluded, pinned, carried)
        taken, took = taken_spares(pool, pinned, carried)
        out = set(excluded) | {v.device_id for v in (*kept.values(), *took.values())}
        built = build_domain_pools(pool, inventory, nodes, node_objects, out, pinned, carried)
        self._findings = built.findings
        pools = (*legacy, *built.pools, *taken, *built.adapters)
        return pools, built.variants | kept | took

    def findings(self) -> tuple[LabelFinding, ...]:
        return self._findings

    def place(
        self, v: Variant, a: cl.FabricAllocation, inv: FabricInventory,
        reports: Mapping[str, NodeFabric],
    ) -> Variant:  # fmt: skip
        claimed = claimed_adapters(
            self._base, a.node, a.adapters, reports.get(a.node) or NodeFabric()
        )
        return placed(v, a.node, inv, reports, claimed)

    def device_of(self, v: Variant, served: str) -> str:
        return v.device_id

    def take_up(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        allocs: Iterable[cl.FabricAllocation], variants: Mapping[str, Variant], workers: object,
        stored: Iterable[Mapping[str, Any]], spares: Collection[str],
    ) -> None:  # fmt: skip
        # Nothing to take up (a device is published by name); what the stored
        # domain pools hold is noted: a spare joins its node's pool only once
        # it has left them (:meth:`with_spares`).
        self._in_domains = in_domain_pools(self._base, stored)

    def models(self, variants: Iterable[Variant]) -> dict[str, str]:
        return {}

    def shortfall(
        self, inv: FabricInventory, allocs: Iterable[cl.FabricAllocation],
        variants: Mapping[str, Variant], served: Callable[[cl.FabricAllocation], str],
        in_use: Collection[str], leaving: Callable[[str], bool],
    ) -> tuple[set[str], set[str]]:  # fmt: skip
        return set(), set()  # an allocated device is allocated by its one name

    def with_spares(
        self, specs: tuple[PoolSpec, ...], inv: FabricInventory,
        reports: Mapping[str, NodeFabric], spares: Mapping[str, Variant],
    ) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:  # fmt: skip
        out, shown, waiting = spare_pools(self._base, specs, inv, spares, self._in_domains)
        self._held_back = waiting
        return out, shown

    def holds_back(self) -> bool:
        return self._held_back
