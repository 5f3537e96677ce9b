"""A node that reaches two switches with the same model: the counters stay true.

A count-based manager asked for "one H100 for node-a" picks from any switch
node-a reaches, so a slot of sw0 may be served by sw1's H100. The allocated
slot is then charged to the counter of the switch its device came from
(docs/fabric.md, "Count-based managers"): what is left of each switch's
counter is what its switch still has free, so the scheduler can still
allocate sw0's free H100 and no longer sw1's taken one. The real reconciler
and workers run on the shipped in-memory API and fabric.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from driver.controller.pool.slots import slot_id
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import counter_name, variant_name
from driver.fabricclient.model import HostAdapter
from driver.kube.api import slice_path
from tests.unit.controller_world import running, settings
from tests.unit.count_manager_world import CLAIMS, H100, World, claim, gpu

A0 = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
A1 = HostAdapter("node-a-a1", "pcie0", "sw1", "node-a", "adapter1")
SW0, SW1 = (counter_name(f"{sw}-{H100}") for sw in ("sw0", "sw1"))


def left(w: World) -> dict[str, int]:
    """Each counter's value less what the allocated devices consume, from the
    stored pool (what the scheduler computes)."""
    slices = w.api.objects(slice_path())
    allocated = {
        r["device"]
        for c in w.api.objects(CLAIMS)
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    out = {
        name: int(counter["value"])
        for s in slices
        for cs in s["spec"].get("sharedCounters") or ()
        for name, counter in cs["counters"].items()
    }
    devices: list[dict[str, Any]] = [d for s in slices for d in s["spec"].get("devices") or ()]
    for d in (d for d in devices if d["name"] in allocated):
        for use in d.get("consumesCounters") or ():
            for name, counter in use["counters"].items():
                out[name] -= int(counter["value"])
    return out


async def test_a_slot_served_from_the_other_switch_is_charged_to_that_switch() -> None:
    sw1_gpu = dataclasses.replace(gpu(1), switch="sw1", adapters=(A1,))
    w = World([dataclasses.replace(gpu(0), adapters=(A0,)), sw1_gpu],
              {"adapter0": "pci0000:15", "adapter1": "pci0000:16"}, live=True)  # fmt: skip
    w.api.add(CLAIMS, claim())  # node-a's first sw0 slot, through adapter0
    assert claim()["status"]["allocation"]["devices"]["results"][0]["device"] == variant_name(
        slot_id("sw0", H100, "node-a", "adapter0", 0), "node-a", "adapter0"
    )
    async with running(Reconciler(w.api, w.fabric, settings())):
        await w.changed.until("the claim Ready", w.ready)
        # The manager chose sw1's H100 (through adapter1) for the sw0 slot.
        assert w.entry()["data"]["fabricDevice"] == "gpu-1"
        assert w.entry()["data"]["adapter"] == "adapter1"
        await w.changed.until(
            "sw0's H100 left for the scheduler and sw1's taken (the pool charging the "
            "slot to the switch its device came from)",
            lambda: left(w) == {SW0: 1, SW1: 0},
        )
    assert w.fabric.scale_ups == 1
