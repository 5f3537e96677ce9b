"""Adapter room in the per-domain shape: a full adapter fails the binding, naming it.

node-a's adapter0 has room for one device (the vPPBs of its virtual switch,
``HostAdapter.room``). The real reconciler and workers on the shipped
in-memory API and fabric (tests/unit/controller_world.py): a claim whose
device would go through adapter0 while it holds another gets
``FabricDeviceFailed`` (reason ``FabricAdapterFull``) naming the adapter and
the node, with no attach request and no hold; meanwhile node-a is cut out
of the domain pool, and taken back once the device leaves. A warm spare
takes room as a claim's device does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from driver.controller.pool.domains import LABEL_PREFIX
from driver.controller.pool.room import AdapterRoom, full_adapters, full_nodes
from driver.controller.pool.variant import Variant
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import FAILED_CONDITION, READY_CONDITION, NodeFabric, device_name
from driver.fabricclient.model import FabricConnection, FabricInventory
from driver.kube.api import slice_path
from tests.unit.controller_world import ADAPTER, MODEL, gpu, running, settings
from tests.unit.domain_claims import CLAIMS, POOL, Counting, claim

ROOMY = dataclasses.replace(ADAPTER, room=1)
DOMAIN = settings(fabric_pool_shape="per-domain")


async def world(gpus: int = 2, room: int = 1) -> Counting:
    """node-a labelled for sw0's domain (as provisioning would), its adapter0 of ``room``."""
    w = Counting(gpus)
    labels = {"metadata": {"labels": {f"{LABEL_PREFIX}pcie0.sw0": ""}}}
    await w.api.merge_patch("/api/v1/nodes/node-a", labels)
    adapter = dataclasses.replace(ADAPTER, room=room)
    w.fabric.devices = {
        d.id: dataclasses.replace(d, adapters=(adapter,)) for d in w.fabric.devices.values()
    }
    w.fabric.adapters = [adapter]
    return w


def claim_for(name: str, device: str, node: str = "node-a") -> dict[str, Any]:
    body = claim(node)
    body["metadata"] |= {"name": name, "uid": f"uid-{name}"}
    body["status"]["allocation"]["devices"]["results"][0]["device"] = device_name(device)
    return body


def conditions(w: Counting, name: str) -> dict[str, dict[str, Any]]:
    stored = next(c for c in w.api.objects(CLAIMS) if c["metadata"]["name"] == name)
    entries = stored.get("status", {}).get("devices") or ()
    return {c["type"]: c for e in entries for c in e.get("conditions", ()) if c["status"] == "True"}


def cut(w: Counting) -> list[str]:
    """The Nodes the domain pool's slices cut out by name."""
    (s,) = [s for s in w.api.objects(slice_path()) if s["spec"]["pool"]["name"] == POOL]
    (term,) = s["spec"]["nodeSelector"]["nodeSelectorTerms"]
    return [v for f in term.get("matchFields", ()) for v in f["values"]]


async def test_a_full_adapter_fails_the_binding_naming_it_and_the_node_is_cut_until_it_frees() -> (
    None
):
    w = await world()
    w.api.add(CLAIMS, claim_for("first", "GPU-0"))
    async with running(Reconciler(w.api, w.fabric, DOMAIN)):
        await w.changed.until("first ready", lambda: READY_CONDITION in conditions(w, "first"))
        await w.changed.until("node-a cut out", lambda: cut(w) == ["node-a"])
        w.api.add(CLAIMS, claim_for("second", "GPU-1"))
        await w.changed.until("second failed", lambda: FAILED_CONDITION in conditions(w, "second"))
        failed = conditions(w, "second")[FAILED_CONDITION]
        assert failed["reason"] == "FabricAdapterFull"
        assert "adapter0" in failed["message"] and "node-a" in failed["message"]
        assert "not held" in failed["message"]
        assert w.asked == [("gpu-0", "node-a", "adapter0")]  # nothing asked for gpu-1
        assert device_name("GPU-1") in w.devices()  # not held: still offered
        await w.api.delete(f"{CLAIMS}/first")
        await w.changed.until(
            "gpu-0 detached", lambda: w.fabric.devices["gpu-0"].connection is None
        )
        await w.changed.until("node-a back in the pool", lambda: cut(w) == [])


async def test_without_a_room_the_fabric_says_nothing_is_limited() -> None:
    w = await world(room=0)
    w.api.add(CLAIMS, claim_for("first", "GPU-0"))
    w.api.add(CLAIMS, claim_for("second", "GPU-1"))
    async with running(Reconciler(w.api, w.fabric, DOMAIN)):
        await w.changed.until(
            "both ready",
            lambda: all(READY_CONDITION in conditions(w, n) for n in ("first", "second")),
        )
        assert cut(w) == []
    assert sorted(w.asked) == [("gpu-0", "node-a", "adapter0"), ("gpu-1", "node-a", "adapter0")]


async def test_two_allocations_in_one_pass_take_the_last_slot_once() -> None:
    w = await world()
    w.api.add(CLAIMS, claim_for("first", "GPU-0"))
    w.api.add(CLAIMS, claim_for("second", "GPU-1"))
    async with running(Reconciler(w.api, w.fabric, DOMAIN)):
        await w.changed.until(
            "one ready, one failed",
            lambda: (
                {READY_CONDITION, FAILED_CONDITION}
                == {t for n in ("first", "second") for t in conditions(w, n)}
            ),
        )
    assert len(w.asked) == 1


async def test_a_warm_spare_takes_room() -> None:
    w = await world()
    rules = settings(fabric_pool_shape="per-domain", spares_fixed=f"gpu:{MODEL}=1", spares_cap=0.5)
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("a spare attached", lambda: len(w.asked) == 1)
        (spare, _, _) = w.asked[0]
        other = "GPU-1" if spare == "gpu-0" else "GPU-0"
        w.api.add(CLAIMS, claim_for("plain", other))
        await w.changed.until("refused", lambda: FAILED_CONDITION in conditions(w, "plain"))
        assert "adapter0" in conditions(w, "plain")[FAILED_CONDITION]["message"]
    assert len(w.asked) == 1


def attached(device: str, node: str = "node-a", adapter: str = "adapter0") -> FabricConnection:
    return FabricConnection("c", "/c", device, node, adapter, "Attaching", "", None)


def test_room_counts_every_binding_and_admits_what_holds_a_slot_already() -> None:
    g0 = dataclasses.replace(gpu(0), adapters=(ROOMY,), connection=attached("gpu-0"))
    g1 = dataclasses.replace(gpu(1), adapters=(ROOMY,))
    inv = FabricInventory((g0, g1), (ROOMY,))
    assert full_adapters(inv) == {("node-a", "adapter0")}
    report = {"node-a": NodeFabric({"adapter0": "pci0000:15"})}
    assert full_nodes((g0, g1), report, full_adapters(inv)) == {"node-a"}
    assert full_nodes((g0, g1), {}, full_adapters(inv)) == set()  # not reported: not its

    def v(device: str) -> Variant:
        return Variant("n", device, "gpu", "G", "node-a", "adapter0", "pci0000:15", once=True)

    room = AdapterRoom(inv)
    assert not room.admit(v("gpu-0")).full  # its own slot
    refused = room.admit(v("gpu-1"))
    assert refused.full and "adapter0" in refused.why and "node-a" in refused.why
    free = FabricInventory((dataclasses.replace(g0, connection=None), g1), (ROOMY,))
    room = AdapterRoom(free)
    assert not room.admit(v("gpu-1")).full and room.admit(v("gpu-0")).full
