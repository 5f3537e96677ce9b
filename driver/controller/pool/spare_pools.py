"""Warm spares when each device is published once: a pool of the spare's node.

Why a module: in the per-domain shape (``driver.controller.pool.domain_pool``)
a ready warm spare on node X (``driver.controller.spares``) must be offered
on X only, while staying the device's single publication. It leaves its
domain pool and is published in ``<fabric_pool>/spares/<X>`` (slice-level
``nodeName: X``: complete from X), under X's own name of the device
(``variant_name``, which the node prepares as is), with its root and
adapter (it is attached), marked a spare with no binding conditions by
``driver.controller.pool.layout.mark_spares``. It is added to X's pool only
once the stored domain pools no longer hold it, so no scheduler ever sees
it twice. A spare a claim was allocated stays in X's pool until released;
its device is in no domain pool meanwhile. Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from driver import DRIVER_NAME
from driver.controller.pool.variant import Variant, memdev_of, placed_device
from driver.devices.model import PCIE_ROOT, Device
from driver.fabric_devices.naming import (
    FABRIC_KIND,
    IDENTITY_ATTRIBUTE,
    SPARE_POOLS,
)
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec, slice_name_prefix

SPARES = SPARE_POOLS


def spare_pool(base: str, node: str) -> str:
    return f"{base}/{SPARES}/{node}"


def node_of(base: str, pool: str) -> str:
    """The node of a spare pool's name, "" for any other pool."""
    head = f"{base}/{SPARES}/"
    return pool[len(head) :] if pool.startswith(head) else ""


def node_pool(base: str, node: str, devices: Iterable[Device]) -> PoolSpec:
    pool = spare_pool(base, node)
    return PoolSpec(
        driver=DRIVER_NAME,
        pool_name=pool,
        name_prefix=slice_name_prefix(pool.replace("/", "."), DRIVER_NAME),
        node_selection={"nodeName": node},
        devices=tuple(sorted(devices, key=lambda d: d.name)),
    )


def in_domain_pools(base: str, stored: Iterable[Mapping[str, Any]]) -> set[str]:
    """The fabric devices the stored domain pools hold (not the spare pools,
    not a per-node pool ``base`` kept for an upgrade)."""
    out = set()
    for obj in stored:
        pool = str(((obj.get("spec") or {}).get("pool") or {}).get("name") or "")
        if pool == base or node_of(base, pool) or not pool.startswith(base + "/"):
            continue
        for raw in (obj.get("spec") or {}).get("devices") or ():
            device = ((raw.get("attributes") or {}).get("fabricDevice") or {}).get("string")
            if device:
                out.add(str(device))
    return out


def spare_pools(
    base: str, specs: tuple[PoolSpec, ...], inv: FabricInventory,
    spares: Mapping[str, Variant], in_domains: Collection[str],
) -> tuple[tuple[PoolSpec, ...], dict[str, Variant], bool]:  # fmt: skip
    """``specs`` with the ready spares ``spares`` (by their nodes' names of
    them) out of the domain pools and, once the stored ones no longer hold them
    (``in_domains``), in their nodes' pools; the spare variants published;
    whether a spare waits for that (a pass is due once the pools are stored)."""
    by_id = {d.id: d for d in inv.devices}
    ready = {n: v for n, v in spares.items() if v.device_id in by_id}
    ids = {v.device_id for v in ready.values()}
    out = []
    for spec in specs:
        if spec.pool_name != base and not node_of(base, spec.pool_name):  # a domain pool
            keep = tuple(d for d in spec.devices if d.attributes.get("fabricDevice") not in ids)
            spec = dataclasses.replace(spec, devices=keep)
        out.append(spec)
    shown = {n: v for n, v in ready.items() if v.device_id not in in_domains}
    per_node: dict[str, list[Device]] = {}
    for v in shown.values():
        per_node.setdefault(v.node, []).append(placed_device(by_id[v.device_id], v))
    merged = {s.pool_name: i for i, s in enumerate(out)}
    for node, devices in sorted(per_node.items()):
        name = spare_pool(base, node)
        if name in merged:  # a taken spare's pool already: the ready ones join it
            held = out[merged[name]]
            out[merged[name]] = node_pool(base, node, (*held.devices, *devices))
        else:
            out.append(node_pool(base, node, devices))
    return tuple(out), shown, len(shown) < len(ready)


def taken_spares(
    base: str, pinned: Mapping[str, str], carried: Mapping[str, Device]
) -> tuple[tuple[PoolSpec, ...], dict[str, Variant]]:
    """The spares claims were allocated from their nodes' pools, kept there
    (as last published) until released."""
    per_node: dict[str, list[Device]] = {}
    variants: dict[str, Variant] = {}
    for name, pool in sorted(pinned.items()):
        node, old = node_of(base, pool), carried.get(name)
        v = spare_variant(old, node) if node and old is not None else None
        if old is not None and v is not None:
            per_node.setdefault(node, []).append(old)
            variants[name] = v
    return tuple(node_pool(base, n, ds) for n, ds in sorted(per_node.items())), variants


def spare_variant(device: Device, node: str) -> Variant | None:
    """The variant a device of ``node``'s spare pool stands for."""
    a = device.attributes
    kind = FABRIC_KIND.get(device.kind, "nic")
    fields = (a.get("fabricDevice"), a.get(IDENTITY_ATTRIBUTE[kind]), a.get("fabricAdapter"),
              a.get(PCIE_ROOT))  # fmt: skip
    if not all(isinstance(f, str) and f for f in fields):
        return None
    dev_id, ident, adapter, root = (str(f) for f in fields)
    v = Variant(device.name, dev_id, kind, ident, node, adapter, root)
    return dataclasses.replace(v, memdev=memdev_of(device, v))
