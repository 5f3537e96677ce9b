"""Pool names from DMTF's own mockups (issue 35): every name unique in its pool.

Every mockup in ``../shared/redfish/mockups`` (and our two-switch tree, which
holds two LDs of one multi-logical device) is read by the real client over
HTTP and built into the fabric pool in both shapes. The apiserver refuses a
duplicate name only within one slice; across slices the allocator treats the
whole pool as invalid, so uniqueness is asserted per pool, over all its
slices. ``public-cxl`` alone lists three logical devices of one memory
device (T3, T4, T5: one serial, LDs 0001, 0007, 0006), which shared one name
per node and adapter before the LDs were told apart.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

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


async def inventory(case: str) -> FabricInventory:
    """The inventory with each system's adapters on a node of its own (node-0, ...)."""
    async with serving(server(case)) as fc:
        first = await fc.inventory()
        uuids = sorted({a.system_uuid.lower() for a in first.adapters if a.system_uuid})
        fc.set_node_uuids({u: f"node-{i}" for i, u in enumerate(uuids)})
        return await fc.inventory()


def reports(inv: FabricInventory) -> dict[str, NodeFabric]:
    """Every node reports every adapter the fabric gives it, each on a root."""
    nodes: dict[str, dict[str, str]] = {}
    for a in inv.adapters:
        if a.node:
            roots = nodes.setdefault(a.node, {})
            roots[a.adapter] = f"pci0000:{len(roots) + 1:02x}"
    return {n: NodeFabric(roots) for n, roots in nodes.items()}


def names(specs: tuple[PoolSpec, ...] | list[PoolSpec]) -> dict[str, list[str]]:
    """Pool name -> the names of its devices, over all the slices it is laid out in."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        for s in build_slices(spec):
            devices = s.spec.get("devices") or ()
            out.setdefault(spec.pool_name, []).extend(str(d["name"]) for d in devices)
    return out


def duplicates(pools: dict[str, list[str]]) -> dict[str, list[str]]:
    return {p: [n for n, c in Counter(ns).items() if c > 1] for p, ns in pools.items() if ns}


@pytest.mark.parametrize("case", CASES)
async def test_every_name_is_unique_in_its_pool_in_both_shapes(case: str) -> None:
    inv = await inventory(case)
    nodes = reports(inv)
    spec, variants = build_pool("fabric", inv, nodes, (), ())
    per_node = names([spec])
    assert not any(duplicates(per_node).values()), duplicates(per_node)
    # One variant per (device, node, adapter) that reaches it: none lost to a clash.
    reach = {(d.id, a.node, a.adapter) for d in inv.devices if d.identity for a in d.adapters}
    expected = {x for x in reach if nodes.get(x[1]) and x[2] in nodes[x[1]].adapters}
    assert {(v.device_id, v.node, v.adapter) for v in variants.values()} == expected
    labels = {dom.label: "" for dom in reach_domains(inv)}
    objects: list[dict[str, Any]] = [
        {"metadata": {"name": n, "labels": labels}} for n in sorted(nodes)
    ]
    built = build_domain_pools("fabric", inv, nodes, objects, (), {}, {})
    per_domain = names(built.pools)
    assert not any(duplicates(per_domain).values()), duplicates(per_domain)
    published = sorted(n for ns in per_domain.values() for n in ns)
    assert len(published) == len({d.id for d in inv.devices if d.identity and d.available})


async def test_the_lds_of_one_memory_device_get_names_of_their_own() -> None:
    """public-cxl's T3, T4 and T5 share a serial; each is a device of its own."""
    inv = await inventory("public-cxl")
    lds = [d for d in inv.devices if d.kind == "cxlmem"]
    assert len({d.identity for d in lds}) == 1 and len(lds) == 3
    assert len({d.unique_identity for d in lds}) == 3
    spec, _ = build_pool("fabric", inv, reports(inv), (), ())
    cxl = [d for d in spec.devices if d.kind == "cxlmem"]
    per_node_adapter = Counter((d.node_name, d.attributes["fabricAdapter"]) for d in cxl)
    assert set(per_node_adapter.values()) == {3}
