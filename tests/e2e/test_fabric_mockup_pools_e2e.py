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
deleted after. Then the real scheduler allocates, from each mockup's pool
in each shape, one claim for every device it offers to one node (Nodes made
by hand, no kubelet: the pod waits in PreBind, the allocation is written
before). The mockups that offer no device are asserted to be just those,
each for its reason (``OFFERS_NOTHING``: a service root without
``Fabrics``, or NVMe-oF subsystems, which are listed apart by NQN), their
pools empty in both shapes, and the real scheduler finds nothing to
allocate for a claim of one device from them: none is skipped. About 30 s
for the module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from driver.controller.pool.domains import reach_domains
from driver.slices.build import PoolSpec, build_slices, slice_object
from tests.e2e.helpers import (
    delete_quietly,
    device_class,
    make_node,
    pod_body,
    unique,
    wait_for,
)
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
NO_FABRICS = "its service root links no Fabrics: an empty fabric"
# The mockups that offer no device to allocate, and why (docs/fabric.md, "Managers tried").
OFFERS_NOTHING = {
    "public-composability": NO_FABRICS,
    "public-compose-action": NO_FABRICS,
    "public-constrained-composition": NO_FABRICS,
    "public-expansion-box": NO_FABRICS,
    "public-smartnic": NO_FABRICS,
    "public-nvmeof-jbof": "NVMe-oF subsystems and their volumes, listed apart by NQN",
}


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


def allocation(resource_api: client.ResourceV1Api, ns: str, name: str) -> Any:
    """The claim's allocation once the scheduler wrote it (60 s at most)."""

    def written() -> Any:
        claim = resource_api.read_namespaced_resource_claim(name, ns)
        return claim.status.allocation if claim.status else None

    return wait_for(f"claim {ns}/{name} allocated", written, timeout=60)


def unschedulable(core: client.CoreV1Api, ns: str, name: str) -> str:
    """The scheduler's message once it found pod ``name`` unschedulable, else ""."""
    for c in core.read_namespaced_pod(name, ns).status.conditions or ():
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return ""


@pytest.mark.parametrize("shape", ["per-node", "per-domain"])
@pytest.mark.parametrize("case", CASES)
async def test_the_real_scheduler_allocates_a_claim_from_each_mockups_pool(
    case: str, shape: str, core: client.CoreV1Api, resource_api: client.ResourceV1Api,
    namespace: str, created: list[str],
) -> None:  # fmt: skip
    """One claim from the pool built from each mockup (this shape's pools, no
    adapter pools), asking for every device the fabric offers to its best
    reached node, each by its ``fabricDevice``: all are allocated, so each
    is in the pool under a name of its own (on the names of before, one of
    public-cxl's LDs and one of the two-switch tree's were lost to a clash,
    and the claim stays unallocated). A mockup that offers nothing: one
    claim of one device from its (empty) pool, which the scheduler cannot
    allocate."""
    base = unique("mockup")
    inv = await inventory(case, prefix=base)
    offered = [d for d in inv.devices if d.identity and d.available]
    assert (not offered) == (case in OFFERS_NOTHING), f"{case}: {len(offered)} offered"
    if not offered:
        assert inv.devices == () and inv.held_back == (), case
        if OFFERS_NOTHING[case] == NO_FABRICS:
            assert inv.adapters == () and inv.nqn_endpoints == (), case
        else:  # NVMe-oF: targets by NQN and the volumes they grant, none a device
            assert inv.nqn_endpoints and inv.volumes, case
        await nothing_to_allocate(base, inv, shape, core, resource_api, namespace, created)
        return
    specs = [per_node(base, inv)] if shape == "per-node" else list(per_domain(base, inv))
    specs = [ours(s) for s in specs if "/adapters/" not in s.pool_name]
    labels = {dom.label: "" for dom in reach_domains(inv)}
    nodes = sorted(reports(inv))
    best = max(nodes, key=lambda n: sum(1 for d in offered if d.adapter_on(n)))
    wanted = sorted(d.id for d in offered if d.adapter_on(best))
    try:
        for n in nodes:
            make_node(core, n, labels)
        publish(resource_api, specs, created)
        claim_and_pod(core, resource_api, namespace, base, [
            {"name": f"d{i}", "exactly": {"deviceClassName": base, "selectors": [{"cel": {
                "expression": f'device.attributes["{DRIVER}"].fabricDevice == "{dev}"'}}]}}
            for i, dev in enumerate(wanted)
        ])  # fmt: skip
        got = allocation(resource_api, namespace, "claim")
        pools = names(specs)
        assert all(r.driver == DRIVER and r.device in pools[r.pool] for r in got.devices.results)
        assert len({(r.pool, r.device) for r in got.devices.results}) == len(wanted)
    finally:
        delete_quietly(core.delete_namespaced_pod, "pod", namespace, grace_period_seconds=0)
        delete_quietly(resource_api.delete_device_class, base)
        for n in nodes:
            delete_quietly(core.delete_node, n)


def ours(spec: PoolSpec) -> PoolSpec:
    """``spec`` published under this module's driver (its own slice names)."""
    return dataclasses.replace(spec, driver=DRIVER, name_prefix=f"{spec.name_prefix}-{DRIVER}")


def publish(resource_api: client.ResourceV1Api, specs: list[PoolSpec], created: list[str]) -> None:
    """Create the slices of each pool spec, noting their names in ``created``."""
    for spec in specs:
        desired = build_slices(spec)
        for d in desired:
            resource_api.create_resource_slice(slice_object(spec, d, 1, len(desired)))
            created.append(d.name)


def claim_and_pod(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str, base: str,
    requests: list[dict[str, Any]], node_selector: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """The device class ``base``, a claim ``claim`` of ``requests`` from it and
    a pod ``pod`` using the claim (tolerating every taint)."""
    resource_api.create_device_class(device_class(base, DRIVER))
    claim = {"metadata": {"name": "claim"}, "spec": {"devices": {"requests": requests}}}
    resource_api.create_namespaced_resource_claim(namespace, claim)
    pod = pod_body("pod", {"resourceClaimName": "claim"})
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    if node_selector:
        pod["spec"]["nodeSelector"] = node_selector
    core.create_namespaced_pod(namespace, pod)


async def nothing_to_allocate(
    base: str, inv: Any, shape: str, core: client.CoreV1Api,
    resource_api: client.ResourceV1Api, namespace: str, created: list[str],
) -> None:  # fmt: skip
    """The pools of a mockup that offers nothing hold no device in ``shape``,
    and a claim of one device of their class stays unallocated, the
    scheduler saying it cannot allocate it (on a Node made by hand)."""
    specs = [per_node(base, inv)] if shape == "per-node" else list(per_domain(base, inv))
    assert {p: ns for p, ns in names(specs).items() if ns} == {}
    node = f"{base}-0"
    try:
        make_node(core, node, {"kubernetes.io/hostname": node})
        publish(resource_api, [ours(spec) for spec in specs], created)
        claim_and_pod(core, resource_api, namespace, base,
                      [{"name": "d0", "exactly": {"deviceClassName": base}}],
                      {"kubernetes.io/hostname": node})  # fmt: skip
        said = wait_for("the scheduler to find nothing to allocate",
                        lambda: unschedulable(core, namespace, "pod"), timeout=60)  # fmt: skip
        assert "cannot allocate all claims" in said, said
        stored = resource_api.read_namespaced_resource_claim("claim", namespace)
        assert stored.status is None or stored.status.allocation is None
    finally:
        delete_quietly(core.delete_namespaced_pod, "pod", namespace, grace_period_seconds=0)
        delete_quietly(resource_api.delete_device_class, base)
        delete_quietly(core.delete_node, node)
