"""A device the fabric's last read held back stays as it was last seen
(issue 35: a failed or partial read never means a device is gone): its
variants stay published and nothing is detached because of the read; a
claim that holds it is told (a Warning naming why), once per reason."""

from __future__ import annotations

import dataclasses

from driver.controller.pool.states import carry_held_back
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import variant_name
from driver.fabricclient.model import FabricConnection, FabricInventory
from driver.kube.api import RESOURCE_V1
from driver.kube.events import EVENTS_V1
from tests.unit.controller_world import Fabric, World, gpu, running, settings

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"


class Doubting(Fabric):
    """The world's fabric, whose reads hold back the devices in ``doubt``."""

    doubt: frozenset[str] = frozenset()

    async def inventory(self) -> FabricInventory:
        whole = await super().inventory()
        self.world.changed.changed()  # a read: the test's waits look again
        return dataclasses.replace(
            whole,
            devices=tuple(d for d in whole.devices if d.id not in self.doubt),
            held_back=tuple((i, "its endpoint answered 500") for i in sorted(self.doubt)),
        )


async def test_a_device_held_back_by_a_read_stays_published() -> None:
    w = World(2)
    fabric = Doubting(list(w.fabric.devices.values()), w)
    w.fabric = fabric
    rec = Reconciler(w.api, fabric, settings(fabric_pool_shape="per-node"))
    async with running(rec):
        await w.changed.until("both GPUs published", lambda: len(w.devices()) == 2)
        before = sorted(w.devices())
        fabric.doubt = frozenset({"gpu-1"})
        rec.refresh_fabric()
        await w.changed.until(
            "a read that holds gpu-1 back",
            lambda: rec.inventory is not None and bool(rec.inventory.held_back),
        )
        rec.reconcile()
        await rec.publisher.in_sync.wait()
        assert sorted(w.devices()) == before  # gpu-1's variant not unpublished
        assert rec.inventory is not None
        assert {d.id for d in rec.inventory.devices} == {"gpu-0", "gpu-1"}


def test_only_what_was_seen_is_carried_and_never_detached_for_a_read() -> None:
    conn = FabricConnection("c", "/c", "gpu-1", "node-a", "adapter0", "Attached", "", None)
    last = FabricInventory((gpu(0), dataclasses.replace(gpu(1), connection=conn)), ())
    new = FabricInventory((gpu(0),), (), held_back=(("gpu-1", "500"), ("gpu-9", "500")))
    carried = carry_held_back(new, last)
    assert [d.id for d in carried.devices] == ["gpu-0", "gpu-1"]  # gpu-9: never seen
    assert carried.devices[1].connection == conn  # as last seen: attached
    assert carry_held_back(new, None) == new


async def test_a_claim_whose_attached_device_is_held_back_is_told_and_keeps_it() -> None:
    w = World(2)
    fabric = Doubting(list(w.fabric.devices.values()), w)
    w.fabric = fabric
    rec = Reconciler(w.api, fabric, settings(fabric_pool_shape="per-node"))
    taken = variant_name("GPU-1", "node-a", "adapter0")
    claim = {
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": taken,
             "bindingConditions": ["FabricDeviceReady"]},
        ]}}},
    }  # fmt: skip

    def told() -> list[str]:
        events = w.api.objects(f"{EVENTS_V1}/namespaces/default/events")
        return [e["note"] for e in events if e["reason"] == "FabricResourceBroken"]

    def ready() -> bool:
        (stored,) = w.api.objects(CLAIMS)
        conds = [c for d in stored["status"].get("devices") or () for c in d["conditions"]]
        return any(c["type"] == "FabricDeviceReady" and c["status"] == "True" for c in conds)

    async with running(rec):
        await w.changed.until("both GPUs published", lambda: len(w.devices()) == 2)
        w.api.add(CLAIMS, claim)
        await w.changed.until("the claim ready", ready)
        fabric.doubt = frozenset({"gpu-1"})
        for _ in range(2):  # two reads holding it back: told once
            rec.refresh_fabric()
            await w.changed.until("a read holding gpu-1 back", lambda: bool(
                rec.inventory is not None and rec.inventory.held_back))  # fmt: skip
            rec.reconcile()
            await rec.recorder.drain()
        (note,) = told()
        assert note == (
            "fabric device gpu-1 is in doubt: its endpoint answered 500; kept as last seen "
            "(published, attached: a partial read detaches and releases nothing)"
        )
        assert fabric.detached == [] and ready() and taken in w.devices()
