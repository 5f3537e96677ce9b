"""Pool names from DMTF's own mockups (issue 35): every name unique in its pool.

Every mockup in ``../shared/redfish/mockups`` (and our two-switch tree, which
holds two LDs of one multi-logical device) is read by the real client over
HTTP and built into the fabric pool in both shapes (tests/unit/mockup_pools.py).
The apiserver refuses a duplicate name only within one slice; across slices
the allocator treats the whole pool as invalid, so uniqueness is asserted per
pool, over all its slices (tests/e2e/test_fabric_mockup_pools_e2e.py creates
them against the real apiserver). ``public-cxl`` alone lists three logical
devices of one memory device (T3, T4, T5: one serial, LDs 0001, 0006, 0007),
which shared one name per node and adapter before the LDs were told apart.
"""

from __future__ import annotations

from collections import Counter

import pytest

from driver.controller.pool.devices import build_pool
from tests.unit.mockup_pools import (
    CASES,
    duplicates,
    inventory,
    names,
    per_domain,
    per_node,
    reports,
)


@pytest.mark.parametrize("case", CASES)
async def test_every_name_is_unique_in_its_pool_in_both_shapes(case: str) -> None:
    inv = await inventory(case)
    nodes = reports(inv)
    assert duplicates(names([per_node("fabric", inv)])) == {}
    # One variant per (device, node, adapter) that reaches it: none lost to a clash.
    _, variants = build_pool("fabric", inv, nodes, (), ())
    reach = {(d.id, a.node, a.adapter) for d in inv.devices if d.identity for a in d.adapters}
    expected = {x for x in reach if nodes.get(x[1]) and x[2] in nodes[x[1]].adapters}
    assert {(v.device_id, v.node, v.adapter) for v in variants.values()} == expected
    pools = names(per_domain("fabric", inv))
    assert duplicates(pools) == {}
    published = [n for p, ns in pools.items() if "/adapters/" not in p for n in ns]
    assert len(published) == len({d.id for d in inv.devices if d.identity and d.available})


async def test_the_lds_of_one_memory_device_get_names_of_their_own() -> None:
    """public-cxl's T3, T4 and T5 share a serial; each is a device of its own."""
    inv = await inventory("public-cxl")
    lds = [d for d in inv.devices if d.kind == "cxlmem"]
    assert len({d.identity for d in lds}) == 1 and len(lds) == 3
    assert len({d.unique_identity for d in lds}) == 3
    cxl = [d for d in per_node("fabric", inv).devices if d.kind == "cxlmem"]
    per_node_adapter = Counter((d.node_name, d.attributes["fabricAdapter"]) for d in cxl)
    assert set(per_node_adapter.values()) == {3}
