"""A node's fabric adapters as devices, so that a pairing claim can ask for one.

Why a module: in the per-domain shape (``driver.controller.pool.domain_pool``)
a fabric device has no ``pcieRoot`` until it is attached, so a claim cannot
pair it with a node's NIC VF, or a fabric GPU with fabric NVMe or CXL memory,
by ``matchAttribute: resource.kubernetes.io/pcieRoot`` (issue 34, "the
pairings"). What is per node, a node's adapters with their root and the reach
domain they are cabled into, is published per node: the pool
``<fabric_pool>/adapters/<node>`` (slice-level ``nodeName``, so complete from
that node alone), one device per reported adapter that reaches a domain, with
``pcieRoot`` (from the node's report), ``fabricAdapter`` and ``fabricDomain``
(from the fabric's reach). A pairing claim asks for one, matching its root with
the VF's and its domain with the fabric devices'; the controller attaches the
claim's fabric devices through it (:func:`claimed_adapters`).

The controller publishes them rather than the plugin: it alone knows the
domains (they are the fabric's topology, ``driver.controller.pool.domains``),
the roots are what the plugin already reports, and a ResourceSlice is all it
writes (as for warm spares), no Node. An adapter device allows many
allocations (every pairing claim on the node goes through it) and has no
capacity: adapter room cannot be kept by consumable capacity, since a claim
that asks for no adapter (a plain fabric GPU, a ``firstAvailable`` list of
local then fabric GPUs) would not consume it. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from driver import DRIVER_NAME
from driver.controller.pool.domains import DOMAIN_ATTRIBUTE, Domain
from driver.devices.model import PCIE_ROOT, Device
from driver.fabric_devices.naming import (
    ADAPTER_TYPE,
    NodeFabric,
    adapter_device_name,
    adapter_pool,
)
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec, slice_name_prefix


def adapter_domains(
    inventory: FabricInventory, domains: Iterable[Domain]
) -> dict[tuple[str, str], str]:
    """(node, adapter) -> the reach domain its adapter is cabled into (the
    domain of the devices that list it among their reach)."""
    of = {i: d.name for d in domains for i in d.devices}
    out: dict[tuple[str, str], str] = {}
    for device in inventory.devices:
        domain = of.get(device.id)
        for a in device.adapters if domain else ():
            out.setdefault((a.node, a.adapter), str(domain))
    return out


def adapter_device(adapter: str, root: str, domain: str) -> Device:
    return Device(
        name=adapter_device_name(adapter),
        kind=ADAPTER_TYPE,
        local_id=adapter,
        attributes={"fabricAdapter": adapter, DOMAIN_ATTRIBUTE: domain, PCIE_ROOT: root},
        allow_multiple_allocations=True,
    )


def adapter_pools(
    base: str,
    inventory: FabricInventory,
    domains: Iterable[Domain],
    reports: Mapping[str, NodeFabric],
) -> tuple[PoolSpec, ...]:
    """One pool per node whose reported adapters reach a domain, by node name."""
    cabled = adapter_domains(inventory, domains)
    out = []
    for node, report in sorted(reports.items()):
        devices = tuple(
            adapter_device(adapter, root, cabled[(node, adapter)])
            for adapter, root in sorted(report.adapters.items())
            if (node, adapter) in cabled and root
        )
        if not devices:
            continue
        pool = adapter_pool(base, node)
        out.append(
            PoolSpec(
                driver=DRIVER_NAME,
                pool_name=pool,
                name_prefix=slice_name_prefix(pool.replace("/", "."), DRIVER_NAME),
                node_selection={"nodeName": node},
                devices=devices,
            )
        )
    return tuple(out)


def claimed_adapters(
    base: str, node: str, results: Iterable[tuple[str, str]], report: NodeFabric
) -> list[str]:
    """The node's adapters a claim was allocated, from its (pool, device)
    results in the node's adapter pool, sorted; an allocated adapter device
    the node no longer reports stays in by its device name (it reaches
    nothing: the attach fails naming it rather than go through another)."""
    pool = adapter_pool(base, node)
    names = {device for p, device in results if p == pool}
    known = {adapter_device_name(a): a for a in report.adapters}
    return sorted(known.get(n, n) for n in names)
