"""The fabric pool built from DMTF's mockups: shared by the unit and cluster tests.

Why a module: the unit test (tests/unit/test_fabric_pool_names.py) and the
cluster test that creates the slices against the real apiserver
(tests/e2e/test_fabric_mockup_pools_e2e.py) read the same mockups with the
real client and build the same pools in both shapes. Every mockup folder in
``../shared/redfish/mockups`` is a case, and our two-switch tree (two LDs of
one multi-logical device, tests/unit/fabric_two_switch.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from driver.controller.pool.devices import build_pool
from driver.controller.pool.domain_pool import build_domain_pools
from driver.controller.pool.domains import reach_domains
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricInventory
from driver.slices.build import PoolSpec, build_slices
from tests.unit.fabric_standard_server import REPO, MockupServer, serving
from tests.unit.fabric_two_switch import two_switch_tree

MOCKUPS = Path(REPO).parent / "shared" / "redfish" / "mockups"
CASES = [*sorted(p.name for p in MOCKUPS.iterdir() if p.is_dir()), "two-switch"]


def server(case: str) -> MockupServer:
    return MockupServer(bodies=two_switch_tree()) if case == "two-switch" else MockupServer(case)


async def inventory(case: str, prefix: str = "node") -> FabricInventory:
    """The inventory with each system's adapters on a node of its own
    (``<prefix>-0``, ...)."""
    async with serving(server(case)) as fc:
        first = await fc.inventory()
        uuids = sorted({a.system_uuid.lower() for a in first.adapters if a.system_uuid})
        fc.set_node_uuids({u: f"{prefix}-{i}" for i, u in enumerate(uuids)})
        return await fc.inventory()


def reports(inv: FabricInventory) -> dict[str, NodeFabric]:
    """Every node reports every adapter the fabric gives it, each on a root."""
    nodes: dict[str, dict[str, str]] = {}
    for a in inv.adapters:
        if a.node:
            roots = nodes.setdefault(a.node, {})
            roots[a.adapter] = f"pci0000:{len(roots) + 1:02x}"
    return {n: NodeFabric(roots) for n, roots in nodes.items()}


def per_node(base: str, inv: FabricInventory) -> PoolSpec:
    spec, _ = build_pool(base, inv, reports(inv), (), ())
    return spec


def per_domain(base: str, inv: FabricInventory) -> tuple[PoolSpec, ...]:
    """The domain pools (every node labelled for every domain), adapter pools beside."""
    nodes = reports(inv)
    labels = {dom.label: "" for dom in reach_domains(inv)}
    objects: list[dict[str, Any]] = [
        {"metadata": {"name": n, "labels": labels}} for n in sorted(nodes)
    ]
    built = build_domain_pools(base, inv, nodes, objects, (), {}, {})
    return (*built.pools, *built.adapters)


def names(specs: Iterable[PoolSpec]) -> dict[str, list[str]]:
    """Pool name -> the names of its devices, over all the slices it is laid out in."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        for s in build_slices(spec):
            devices = s.spec.get("devices") or ()
            out.setdefault(spec.pool_name, []).extend(str(d["name"]) for d in devices)
    return out


def duplicates(pools: dict[str, list[str]]) -> dict[str, list[str]]:
    """Pool name -> the names it holds more than once (pools with none left out)."""
    found = {p: [n for n, c in Counter(ns).items() if c > 1] for p, ns in pools.items()}
    return {p: ns for p, ns in found.items() if ns}
