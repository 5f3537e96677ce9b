"""A device published once is attached to the node the scheduler picked (issue 34, step 2).

The allocation names the device (pool ``fabric/<domain>``) and, through its
``nodeSelector``, the node; the controller attaches through that node's
adapter that reaches the device, asks the fabric exactly once, writes
``FabricDeviceReady`` on the entry of the allocation's own pool with the
name the node prepares it as, and detaches on release. A node with no
adapter that reaches the device fails the binding, naming the node. The
real reconciler and workers run on the shipped in-memory API and fabric
(tests/unit/controller_world.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from driver.claims.allocation import parse_allocation
from driver.controller.reconciler import Reconciler
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.errors import ClaimError
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    PREPARED_AS_KEY,
    READY_CONDITION,
    device_name,
    variant_name,
)
from driver.kube.api import slice_path
from tests.unit.controller_world import MODEL, World, running, settings
from tests.unit.domain_claims import ADAPTERS, CLAIMS, NAME, POOL, Counting, claim, condition, entry


async def test_the_device_is_attached_once_through_the_picked_nodes_adapter() -> None:
    w = Counting()
    w.api.add(CLAIMS, claim("node-a"))
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))):
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        assert entry(w)["pool"] == POOL and entry(w)["device"] == NAME
        data = entry(w)["data"]
        assert data["adapter"] == "adapter0" and data["fabricDevice"] == "gpu-0"
        assert data[PREPARED_AS_KEY] == variant_name("GPU-0", "node-a", "adapter0")
        # Released: detached, and nothing asked again.
        (stored,) = w.api.objects(CLAIMS)
        await w.api.delete(f"{CLAIMS}/{stored['metadata']['name']}")
        await w.changed.until("the detach", lambda: w.fabric.devices["gpu-0"].connection is None)
    assert w.asked == [("gpu-0", "node-a", "adapter0")]


async def test_a_node_that_reaches_nothing_fails_the_binding_naming_it() -> None:
    w = Counting()
    w.api.add(CLAIMS, claim("node-z"))
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))):
        await w.changed.until("the failure", lambda: condition(w, FAILED_CONDITION))
    message = next(c["message"] for c in entry(w)["conditions"] if c["type"] == FAILED_CONDITION)
    assert "node-z" in message and "gpu-0" in message and w.asked == []


def test_the_node_prepares_a_domain_pools_device_as_its_own_fabric_device() -> None:
    own = variant_name("GPU-0", "node-a", "adapter0")
    inventory = NodeInventory()
    inventory.replace_pool("fabric", [Device(own, "gpu", "GPU-0")])
    inventory.replace_pool("node-a", [])
    ready = claim("node-a")
    ready["status"]["devices"] = [{"driver": "patchbay.dev", "pool": POOL, "device": NAME,
                                   "data": {PREPARED_AS_KEY: own}}]  # fmt: skip
    (result,) = parse_allocation(ready, "uid-1", inventory.pools()).devices
    assert (result.pool, result.device, result.prepared_as) == (POOL, NAME, own)
    found = inventory.lookup(result.pool, result.prepared_as)
    assert found is not None and found.local_id == "GPU-0"
    assert inventory.lookup("fabricx/d", own) is None and inventory.lookup("node-a/x", own) is None
    with pytest.raises(ClaimError, match="which this node does not serve"):
        other = claim("node-a")
        other["status"]["allocation"]["devices"]["results"][0]["pool"] = "fabricx/d"
        parse_allocation(other, "uid-1", inventory.pools())


async def test_an_upgrade_keeps_a_per_node_allocation_until_released() -> None:
    """A claim allocated from today's per-node variant, then the shape changes:
    its variant stays published (alone) in the old pool, its device in no
    domain pool; the attach goes through the variant's adapter once; on
    release the old pool is withdrawn and the device is published once."""
    w = Counting()
    old = variant_name("GPU-0", "node-a", "adapter0")
    async with running(
        Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))
    ):  # the chart before
        await w.changed.until("the per-node pool", lambda: old in w.devices())
    allocated = claim("node-a")
    result = allocated["status"]["allocation"]["devices"]["results"][0]
    result |= {"pool": "fabric", "device": old}
    w.api.add(CLAIMS, allocated)
    upgraded = Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))
    async with running(upgraded):
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        assert pools(w) == {"fabric": [old], **ADAPTERS}  # gpu-0 is in no domain pool meanwhile
        assert entry(w)["pool"] == "fabric" and PREPARED_AS_KEY not in entry(w)["data"]
        await w.api.delete(f"{CLAIMS}/claim")
        await w.changed.until(
            "the device published once", lambda: pools(w) == {POOL: [NAME], **ADAPTERS}
        )
        await w.changed.until("the detach", lambda: w.fabric.devices["gpu-0"].connection is None)
    assert w.asked == [("gpu-0", "node-a", "adapter0")]


def pools(w: World) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in w.api.objects(slice_path()):
        out.setdefault(s["spec"]["pool"]["name"], []).extend(
            d["name"] for d in s["spec"].get("devices") or ()
        )
    return out


async def test_a_ready_spare_leaves_the_domain_pool_for_its_nodes_own_and_is_taken_there() -> None:
    """A fixed spare, once its node reports it, is published once: gone from
    the domain pool, in node-a's own pool (nodeName, no binding conditions),
    added only after the domain pool without it is stored. A claim allocated
    it there takes it with no attach request; it stays there until released."""
    w = Counting(gpus=2)
    rules = settings(fabric_pool_shape="per-domain", spares_fixed=f"gpu:{MODEL}=1",
                     spares_cap=0.5)  # fmt: skip
    spare_pool = "fabric/spares/node-a"
    # The domain pool's rewrite without the spare fails a few times first.
    w.api.fail("PUT", slice_path("fabric.pcie0.sw0-patchbay-0"), 500, times=2)
    seen: list[dict[str, list[str]]] = []  # the stored pools when node-a's is first written

    def store(path: str, obj: dict[str, Any]) -> None:
        if "resourceslices" in path and obj["spec"]["pool"]["name"] == spare_pool and not seen:
            seen.append(pools(w))
        w.changed.changed()

    w.api.on_store = store
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("a spare in node-a's pool", lambda: spare_pool in pools(w))
        ((name,),) = [pools(w)[spare_pool]]
        spare_id = "gpu-0" if name == variant_name("GPU-0", "node-a", "adapter0") else "gpu-1"
        other = device_name("GPU-1" if spare_id == "gpu-0" else "GPU-0")
        assert pools(w)[POOL] == [other]  # published once: not in the domain pool
        # It left the stored domain pool before it joined node-a's.
        assert seen[0][POOL] == [other]
        (stored,) = [s for s in w.api.objects(slice_path()) if s["spec"]["pool"]["name"]
                     == spare_pool]  # fmt: skip
        assert stored["spec"]["nodeName"] == "node-a"
        (dev,) = stored["spec"]["devices"]
        assert dev["attributes"]["spare"] == {"bool": True} and "bindingConditions" not in dev
        asked = len(w.asked)
        taken = claim("node-a")
        result = taken["status"]["allocation"]["devices"]["results"][0]
        result |= {"pool": spare_pool, "device": name}
        del result["bindingConditions"], result["bindingFailureConditions"]
        w.api.add(CLAIMS, taken)
        await w.changed.until("another spare", lambda: len(w.asked) == asked + 1)
        assert name in pools(w)[spare_pool]  # taken: kept where it was allocated
        assert all(name not in ds for p, ds in pools(w).items() if p != spare_pool)
    assert ("gpu-0" if spare_id == "gpu-1" else "gpu-1", "node-a", "adapter0") in w.asked
    assert w.asked.count((spare_id, "node-a", "adapter0")) == 1  # the spare's own, no other
