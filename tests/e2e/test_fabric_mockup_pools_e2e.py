"""The pool built from each DMTF mockup, created against the real apiserver (issue 35).

The apiserver refuses a duplicate device name only within one slice; across
the slices of one pool it accepts it, and the allocator then treats the whole
pool as invalid. So every slice of the pool built from each mockup in
``../shared/redfish/mockups`` (and our two-switch tree), in both shapes, is
created for real and read back: each pool's names are found once, and every
device is there (per node and adapter that reaches it, or once per domain),
none lost to a clash (tests/unit/mockup_pools.py builds them;
tests/unit/test_fabric_pool_names.py asserts the same without a control
plane). public-cxl and the two-switch tree fail on the names of before. The slices name a driver of
their own, so no controller of the session takes them for its own, and are
deleted after. No scheduler step: the claim allocated from each mockup's
pool is not yet here (docs/fabric.md, "Logical devices").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from kubernetes import client

from driver.slices.build import PoolSpec, build_slices, slice_object
from tests.e2e.helpers import unique
from tests.unit.mockup_pools import (
    CASES,
    duplicates,
    inventory,
    names,
    per_domain,
    per_node,
    reports,
)

pytestmark = pytest.mark.cluster

DRIVER = "mockups.patchbay.dev"


@pytest.fixture
def created(resource_api: client.ResourceV1Api) -> Iterator[list[str]]:
    """Slice names created by a test, deleted after it."""
    made: list[str] = []
    yield made
    for name in made:
        resource_api.delete_resource_slice(name)


@pytest.mark.parametrize("case", CASES)
async def test_every_name_is_once_in_its_pool_as_the_apiserver_stores_it(
    case: str, resource_api: client.ResourceV1Api, created: list[str]
) -> None:
    inv = await inventory(case)
    base = unique("mockup")
    specs: list[PoolSpec] = [
        dataclasses.replace(s, driver=DRIVER, name_prefix=f"{s.name_prefix}-{DRIVER}")
        for s in (per_node(f"{base}-node", inv), *per_domain(f"{base}-domain", inv))
    ]
    for spec in specs:
        desired = build_slices(spec)
        for d in desired:
            resource_api.create_resource_slice(slice_object(spec, d, 1, len(desired)))
            created.append(d.name)
    stored: dict[str, list[str]] = {}
    variants: set[tuple[str, str, str]] = set()  # per-node: (device, node, adapter)
    once: set[str] = set()  # per-domain: the devices
    listed = resource_api.list_resource_slice(field_selector=f"spec.driver={DRIVER}")
    for s in listed.items:
        pool = s.spec.pool.name
        if not pool.startswith(base):
            continue
        stored.setdefault(pool, []).extend(d.name for d in s.spec.devices or ())
        for d in s.spec.devices or ():
            a = {k: v.string for k, v in (d.attributes or {}).items()}
            if pool == f"{base}-node":
                variants.add((a["fabricDevice"], d.node_name, a["fabricAdapter"]))
            elif "fabricDevice" in a:
                once.add(a["fabricDevice"])
    assert duplicates(stored) == {}
    # Each device (per node and adapter that reaches it) is there: none lost to a clash.
    nodes = reports(inv)
    reach = {(d.id, a.node, a.adapter) for d in inv.devices if d.identity for a in d.adapters}
    assert variants == {x for x in reach if x[1] in nodes and x[2] in nodes[x[1]].adapters}
    assert once == {d.id for d in inv.devices if d.identity and d.available}
    want = names(specs)
    assert {p: sorted(ns) for p, ns in stored.items() if ns} == {
        p: sorted(ns) for p, ns in want.items() if ns
    }
