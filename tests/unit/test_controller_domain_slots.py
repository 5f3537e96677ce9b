"""A count-based manager's slots published once per reach domain (issue 34, step 2).

With ``fabric_pool_shape: per-domain`` a count manager's model slots are
published once in their reach domain's pool (``fabric/<domain>``), not once
per node and adapter: as many slots per switch and model as the switch has
devices, less what allocations and ready spares hold, with no counter, no
node and no root. The scheduler picks the node; the controller asks the
manager once for one device of the model for that node, through that
node's adapter, and writes the node's own name of what arrived. A ready
spare on node X is offered only on X (``fabric/spares/X``) and takes a slot
of its group out of the domain pool: a claim allocated it there is Ready
with no scale-up. The real reconciler, workers and spare keeper run on the
shipped in-memory API and count manager (tests/unit/count_manager_world.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from driver.controller import claims as cl
from driver.controller.pool.domain_slots import build_domain_slots, domain_slot_id
from driver.controller.pool.slots import build_count_pool
from driver.controller.reconciler import Reconciler
from driver.devices.model import Device
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    PREPARED_AS_KEY,
    READY_CONDITION,
    NodeFabric,
    device_name,
    variant_name,
)
from driver.fabricclient.model import FabricInventory, HostAdapter
from driver.kube.api import slice_path
from tests.signals import Signal
from tests.unit.controller_world import running, settings
from tests.unit.count_manager_world import (
    CLAIMS,
    DOMAIN_LABEL,
    DOMAIN_POOL,
    H100,
    World,
    claim,
    gpu,
)

H200 = "H200-SXM5-141GB"
ROOTS = {"adapter0": "pci0000:15"}
NODES = ("node-a", "node-b", "node-c")
ADAPTERS = tuple(HostAdapter(f"{n}-a0", "pcie0", "sw0", n, "adapter0") for n in NODES)
RULES = {"spares_fixed": f"gpu:{H100}=1", "spares_cap": 0.5}  # one spare: half of two


def everywhere(i: int, model: str = H100) -> Any:
    return dataclasses.replace(gpu(i), model=model, adapters=ADAPTERS)


def slot(i: int, model: str = H100) -> str:
    return device_name(domain_slot_id(DOMAIN_POOL, "fabric", "sw0", model, i))


def devices(w: World) -> dict[str, tuple[str, dict[str, Any]]]:
    """Device name -> (its pool, the device), as stored."""
    return {d["name"]: (s["spec"]["pool"]["name"], d) for s in w.api.objects(slice_path())
            for d in s["spec"].get("devices") or ()}  # fmt: skip


def test_each_slot_is_published_once_not_per_node() -> None:
    inv = FabricInventory((everywhere(0), everywhere(1), everywhere(2, H200)), ADAPTERS)
    reports = {n: NodeFabric(ROOTS) for n in NODES}
    nodes = [{"metadata": {"name": n, "labels": {DOMAIN_LABEL: ""}}} for n in NODES]
    per_node, _ = build_count_pool("fabric", inv, reports, (), ())
    assert len(per_node.devices) == 9  # a slot per device, node and adapter
    built = build_domain_slots("fabric", inv, reports, nodes, (), {}, {}, {})
    (spec,) = built.pools
    assert spec.pool_name == DOMAIN_POOL and not spec.counter_sets
    assert {d.name for d in spec.devices} == {slot(0), slot(1), slot(0, H200)}
    assert all(d.node_name is None and d.binds_to_node for d in spec.devices)
    assert all("resource.kubernetes.io/pcieRoot" not in d.attributes for d in spec.devices)
    (term,) = spec.node_selection["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": DOMAIN_LABEL, "operator": "Exists"}]
    # Slot 0 allocated, served by gpu-1: one H100 slot left free beside it.
    old = next(d for d in spec.devices if d.name == slot(0))
    pinned, carried = {slot(0): DOMAIN_POOL}, {slot(0): old}
    again = build_domain_slots("fabric", inv, reports, nodes, (), pinned, carried,
                               {slot(0): "gpu-1"})  # fmt: skip
    (spec,) = again.pools
    assert {d.name for d in spec.devices} == {slot(0), slot(1), slot(0, H200)}
    assert again.free[(DOMAIN_POOL, "sw0", "gpu", H100)] == [slot(1)]
    # A second one allocated (slot 1, nothing arrived yet): no H100 slot left free.
    pinned[slot(1)] = DOMAIN_POOL
    carried[slot(1)] = next(d for d in spec.devices if d.name == slot(1))
    full = build_domain_slots("fabric", inv, reports, nodes, (), pinned, carried,
                              {slot(0): "gpu-1"})  # fmt: skip
    (spec,) = full.pools
    assert {d.name for d in spec.devices} == {slot(0), slot(1), slot(0, H200)}
    assert (DOMAIN_POOL, "sw0", "gpu", H100) not in full.free


async def test_a_slot_is_asked_once_for_the_node_the_scheduler_picked() -> None:
    b0 = HostAdapter("node-b-a0", "pcie0", "sw0", "node-b", "adapter1")
    gpus = [dataclasses.replace(gpu(i), adapters=(ADAPTERS[0], b0)) for i in range(2)]
    w = World(gpus, ROOTS, live=True, more={"node-b": {"adapter1": "pci0000:3a"}})
    w.api.add(CLAIMS, claim("per-domain", node="node-b"))
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))):
        await w.changed.until("the claim Ready", w.ready)
        stored = devices(w)
    assert w.fabric.scale_ups == 1 and w.fabric.attached == [("gpu-1", "node-b", "adapter1")]
    assert w.entry()["pool"] == DOMAIN_POOL and w.entry()["device"] == slot(0)
    data = w.entry()["data"]
    assert data["fabricDevice"] == "gpu-1" and data["adapter"] == "adapter1"
    assert data[PREPARED_AS_KEY] == variant_name("GPU-1", "node-b", "adapter1")
    # Each slot once, in the domain's pool: the allocated one and one free.
    assert {n: p for n, (p, _) in stored.items()} == {slot(0): DOMAIN_POOL, slot(1): DOMAIN_POOL}


def spare_claim(name: str, device: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric/spares/node-a",
              "device": device}  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def spares(w: World) -> dict[str, str]:
    """Spare name -> its pool."""
    return {n: p for n, (p, d) in devices(w).items() if d["attributes"]["spare"]["bool"]}


async def test_a_spare_is_offered_on_its_node_only_and_taken_with_no_scale_up() -> None:
    gpus = [dataclasses.replace(gpu(i), adapters=ADAPTERS[:2]) for i in range(2)]
    w = World(gpus, ROOTS, live=True, more={"node-b": ROOTS})
    spare = variant_name("GPU-1", "node-a", "adapter0")  # asked through gpu-0, gpu-1 came
    rules = settings(fabric_pool_shape="per-domain", **RULES)
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("a spare published", lambda: spares(w) != {})
        assert spares(w) == {spare: "fabric/spares/node-a"} and w.fabric.scale_ups == 1
        assert "bindingConditions" not in devices(w)[spare][1]
        (held,) = [s["spec"] for s in w.api.objects(slice_path())
                   if s["spec"]["pool"]["name"] == "fabric/spares/node-a"]  # fmt: skip
        assert held["nodeName"] == "node-a"  # offered on node-a only
        # The spare holds one of the two devices: one slot left in the domain.
        assert [n for n, (p, _) in devices(w).items() if p == DOMAIN_POOL] == [slot(0)]
        w.api.add(CLAIMS, spare_claim("takes", spare))

        def taken() -> bool:
            (c,) = w.api.objects(CLAIMS)
            return [a.ready for a in cl.fabric_allocations(c, "fabric")] == [True]

        await w.changed.until("the spare's claim Ready", taken)
        (stored,) = w.api.objects(CLAIMS)
        (entry,) = stored["status"]["devices"]
        assert entry["data"]["fabricDevice"] == "gpu-1"
        assert READY_CONDITION in {c["type"] for c in entry["conditions"]}
        # The next spare is gpu-0, asked for the keeper; the claim asked nothing.
        replacement = variant_name("GPU-0", "node-a", "adapter0")
        await w.changed.until("the replacement spare", lambda: list(spares(w)) == [replacement])
        assert [n for n, (p, _) in devices(w).items() if p == DOMAIN_POOL] == []
    assert w.fabric.scale_ups == 2 and w.fabric.detached == []


def test_a_taken_spare_holds_a_slot_of_its_group() -> None:
    inv = FabricInventory((everywhere(0), everywhere(1)), ADAPTERS)
    reports = {n: NodeFabric(ROOTS) for n in NODES}
    nodes = [{"metadata": {"name": n, "labels": {DOMAIN_LABEL: ""}}} for n in NODES]
    taken = Device(variant_name("GPU-1", "node-a", "adapter0"), "gpu", "GPU-1")
    pinned = {taken.name: "fabric/spares/node-a"}
    built = build_domain_slots("fabric", inv, reports, nodes, (), pinned, {taken.name: taken},
                               {taken.name: "gpu-1"})  # fmt: skip
    (spec,) = built.pools
    assert [d.name for d in spec.devices] == [slot(0)]


async def test_another_model_arriving_fails_the_claim_and_holds_its_slot() -> None:
    """The manager brings another model (the count dialect gives it back and
    says so): the claim fails naming it, the slot is held out of the domain
    pool for the hold time (one fewer offered), and nothing is asked again."""
    w = World([gpu(0), gpu(1)], ROOTS, live=True)
    w.fabric.wrong_next = 1
    w.api.add(CLAIMS, claim("per-domain"))

    def failed() -> bool:
        conds = w.entry().get("conditions") or ()
        return any(c["type"] == FAILED_CONDITION and c["status"] == "True" for c in conds)

    rec = Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))
    async with running(rec):
        await w.changed.until("the claim failed", failed)
        message = next(c["message"] for c in w.entry()["conditions"]
                       if c["type"] == FAILED_CONDITION)  # fmt: skip
        assert "arrived instead" in message and "held" in message, message
        # The failed slot leaves the pool at once (as a failed device does) and
        # holds its device meanwhile: the other one's slot alone is offered.
        await w.changed.until("slot 0 dropped", lambda: sorted(devices(w)) == [slot(1)])
        # Deallocated, its slot stays held out for the hold time: one offered, not two.
        passes, run = Signal(), rec.reconcile

        def noted() -> None:  # each pass wakes the wait below
            run()
            passes.changed()

        rec.reconcile = noted  # type: ignore[method-assign]
        await w.api.delete(f"{CLAIMS}/claim")
        await passes.until("a pass without the claim", lambda: not rec.claims.objects)
        async with asyncio.timeout(5.0):
            await rec.publisher.in_sync.wait()
        assert sorted(devices(w)) == [slot(1)]
    assert w.fabric.scale_ups == 1 and w.fabric.attached == []
