"""A device the fabric's last read held back stays as it was last seen
(issue 35: a failed or partial read never means a device is gone): its
variants stay published and nothing is detached because of the read."""

from __future__ import annotations

import dataclasses

from driver.controller.pool.states import carry_held_back
from driver.controller.reconciler import Reconciler
from driver.fabricclient.model import FabricConnection, FabricInventory
from tests.unit.controller_world import Fabric, World, gpu, running, settings


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
    rec = Reconciler(w.api, fabric, settings())
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
