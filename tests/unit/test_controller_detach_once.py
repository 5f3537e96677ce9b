"""Each detach is asked once and counted once; a spare's attach is not doubled.

An operation's end makes the reconciler re-read the fabric and pass at once,
and the pass usually runs before the re-read is in: the inventory in hand
still shows the device as it was before the operation. The clean-clone CI
run of 33acd28 detached (and counted) one device twice that way
(``test_controller_metrics_e2e``). Here the re-read is held back until the
test lets it go, so the pass on the stale inventory always happens; the
real reconciler, workers and spare keeper run on the shipped in-memory API
and fabric.
"""

from __future__ import annotations

import asyncio
from typing import Any

from driver.controller.reconciler import Reconciler
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.metrics import FABRIC_OPS
from tests.signals import Signal
from tests.unit.controller_world import MODEL, Fabric, World, running, settings


class HeldFabric(Fabric):
    """Reads taken after ``hold()`` answer only once ``release()``d, with
    what the fabric held when they were asked; counts detach requests."""

    def __init__(self, devices: list[FabricDevice], world: World) -> None:
        super().__init__(devices, world)
        self.detaches, self.attaches = 0, 0
        self._held: asyncio.Event | None = None

    def hold(self) -> None:
        self._held = asyncio.Event()

    def release(self) -> None:
        assert self._held is not None
        self._held.set()
        self._held = None

    async def inventory(self) -> FabricInventory:
        seen = await super().inventory()
        if self._held is not None:
            await self._held.wait()
        return seen

    async def detach(self, device_id: str) -> Any:
        self.detaches += 1
        self.hold()  # the re-read this detach's end asks for waits
        return await super().detach(device_id)

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> Any:
        self.attaches += 1
        self.hold()
        return await super().attach(device_id, node, adapter, key)


def world(gpus: int) -> tuple[World, HeldFabric]:
    w = World(gpus)
    fabric = HeldFabric(list(w.fabric.devices.values()), w)
    fabric.instant = True
    w.fabric = fabric
    return w, fabric


def watch_passes(rec: Reconciler, fabric: HeldFabric, signal: Signal) -> list[bool]:
    """Each pass appends whether it began on an inventory read before an
    operation that has ended since (the stale pass under test)."""
    passes: list[bool] = []
    keep = rec.spares.reconcile
    w = rec.workers

    def noted(*args: Any) -> Any:
        passes.append(any(not w.busy(d) and w.settling(d) for d in fabric.devices))
        view = keep(*args)
        signal.changed()
        return view

    rec.spares.reconcile = noted  # type: ignore[method-assign,assignment]
    return passes


def running_any(rec: Reconciler, fabric: HeldFabric) -> list[str]:
    return [d for d in fabric.devices if rec.workers.busy(d)]


def detaches_ok() -> float:
    value: float = FABRIC_OPS.labels(op="detach", result="ok")._value.get()
    return value


async def test_a_pass_on_the_inventory_before_a_detach_ends_does_not_detach_again() -> None:
    w, fabric = world(gpus=1)
    # A leftover: attached to node-a, and no claim needs it.
    await Fabric.attach(fabric, "gpu-0", "node-a", "adapter0")
    before = detaches_ok()
    rec = Reconciler(w.api, fabric, settings(fabric_pool_shape="per-node"))
    passes = watch_passes(rec, fabric, w.changed)
    async with running(rec):
        await w.changed.until("a pass on the inventory from before the detach", lambda: any(passes))
        assert running_any(rec, fabric) == [], "a second detach started on a stale inventory"
        stale = len(passes)
        fabric.release()
        await w.changed.until("a pass on an inventory read after the detach", lambda: (
            len(passes) > stale and not passes[-1]
        ))  # fmt: skip
    assert fabric.detaches == 1 and fabric.devices["gpu-0"].connection is None
    assert detaches_ok() == before + 1


async def test_a_pass_on_the_inventory_before_a_spare_arrived_attaches_no_other() -> None:
    w, fabric = world(gpus=3)
    rec = Reconciler(
        w.api,
        fabric,
        settings(fabric_pool_shape="per-node", spares_fixed=f"gpu:{MODEL}=1", spares_cap=1.0),
    )
    passes = watch_passes(rec, fabric, w.changed)
    async with running(rec):
        await w.changed.until("a pass on the inventory from before the attach", lambda: any(passes))
        assert running_any(rec, fabric) == [], "a second spare attach started on a stale inventory"
        fabric.release()
        await w.changed.until("the spare published", lambda: w.spares() != [])
    assert fabric.attaches == 1 and len(fabric.attached) == 1
