"""Warm spares through the real reconciler, on the shipped in-memory API and fabric.

A fixed spare is attached, published without binding conditions once its
node reports it, and kept by a restarted controller without a new attach;
a demand-driven spare follows a claim's allocation and is detached once
idle past its timeout on the reconciler's injected clock (no waiting).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import variant_name
from driver.kube.api import RESOURCE_V1
from tests.unit.controller_world import MODEL, World, running, settings


@contextmanager
def clock(rec: Reconciler, start: float = 1000.0) -> Iterator[list[float]]:
    now = [start]
    rec.clock = lambda: now[0]
    yield now


async def test_a_fixed_spare_is_published_without_binding_conditions_and_survives_a_restart() -> (
    None
):
    w = World(gpus=2)
    spare_gpu1 = variant_name("GPU-1", "node-a", "adapter0")
    taken_gpu0 = variant_name("GPU-0", "node-a", "adapter0")
    rules = settings(fabric_pool_shape="per-node", spares_fixed=f"gpu:{MODEL}=1", spares_cap=0.5)
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("a spare published", lambda: w.spares() != [])
    (name,) = w.spares()
    spare = w.devices()[name]
    assert "bindingConditions" not in spare and "bindsToNode" not in spare
    other = next(d for n, d in w.devices().items() if n != name)
    assert other["bindingConditions"] == ["FabricDeviceReady"]
    assert other["attributes"]["spare"] == {"bool": False}
    assert len(w.fabric.attached) == 1 and name in (spare_gpu1, taken_gpu0)
    # A restarted controller keeps it: no detach, no second attach.
    rec = Reconciler(w.api, w.fabric, rules)
    keep = rec.spares.reconcile

    def noted(*args: Any) -> Any:  # each of its passes wakes the wait below
        view = keep(*args)
        w.changed.changed()
        return view

    rec.spares.reconcile = noted  # type: ignore[method-assign,assignment]
    async with running(rec):
        await w.changed.until("the restart's pass", lambda: bool(rec.spares.last.keep), 10.0)
        async with asyncio.timeout(5.0):
            await rec.publisher.in_sync.wait()
    assert len(w.fabric.attached) == 1 and w.fabric.detached == []
    assert w.spares() == [name]


async def test_a_demand_spare_follows_an_allocation_and_leaves_when_idle() -> None:
    w = World(gpus=3)
    rules = settings(
        fabric_pool_shape="per-node",
        spares_demand="gpu:*=1",
        spares_idle_timeout=30,
        spares_cap=0.5,
    )
    rec = Reconciler(w.api, w.fabric, rules)
    taken = variant_name("GPU-0", "node-a", "adapter0")
    claim = {
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": taken,
             "bindingConditions": ["FabricDeviceReady"]},
        ]}}},
    }  # fmt: skip
    with clock(rec) as now:
        async with running(rec):
            await w.changed.until("the pool", lambda: len(w.devices()) == 3)
            assert w.spares() == [] and w.fabric.attached == []  # no demand yet
            w.api.add(f"{RESOURCE_V1}/namespaces/default/resourceclaims", claim)
            await w.changed.until("a spare after the attach", lambda: len(w.spares()) == 1)
            (spare_dev,) = {a[0] for a in w.fabric.attached} - {"gpu-0"}  # gpu-0: the claim's
            now[0] += 31  # idle past the timeout
            rec.mark()
            await w.changed.until("the idle spare detached", lambda: w.fabric.detached != [])
            assert w.fabric.detached == [spare_dev] and w.spares() == []
            # Not replaced: the idle spare closed the node's demand window.
            assert len(w.fabric.attached) == 2 and rec.spares.last.attach == ()
