"""A count-based manager attaches before it answers: what arrives meanwhile is kept for the answer.

The manager's scale-up attaches the device it chose, and the fabric shows
it on the node (events, an inventory read) before the answer names it.
A pass in that moment saw a device of the node that nothing named: it
detached it as a leftover, the claim was made Ready on the answer all the
same, and the node's plugin refused the prepare ("not on this node"; the
flaky test_claims_run_on_the_devices_the_manager_chose), or it gave it to
another allocation of the node (two claims on one device). The real
reconciler and workers on the shipped in-memory API and fabric, the pass
held exactly in that moment.
"""

from __future__ import annotations

import asyncio

from driver.controller import claims as cl
from driver.controller.reconciler import Reconciler
from tests.unit.controller_world import running, settings
from tests.unit.count_manager_world import CLAIMS, World, claim, gpu


async def test_a_device_that_arrives_before_the_answer_is_not_detached() -> None:
    w = World([gpu(0), gpu(1)], {"adapter0": "pci0000:15"}, live=True)
    answer = w.fabric.answer = asyncio.Event()
    w.api.add(CLAIMS, claim())
    rec = Reconciler(w.api, w.fabric, settings())
    async with running(rec):
        await w.changed.until("the manager's attach", lambda: w.fabric.attached != [])
        # The moment between the attach and the answer: a pass on the fabric
        # as it is now, gpu-1 on node-a and named by nothing yet.
        rec.inventory = await w.fabric.inventory()
        assert rec.inventory.device("gpu-1").connection is not None
        rec.reconcile()
        assert not rec.workers.busy("gpu-1"), "a detach of gpu-1 was started"
        answer.set()
        await w.changed.until("the claim Ready", w.ready)
        assert w.fabric.detached == [] and w.fabric.scale_ups == 1
        assert w.entry()["data"]["fabricDevice"] == "gpu-1"
        assert w.entry()["data"]["preparedAs"].startswith("fgpu-")
    alloc = cl.fabric_allocations(w.api.objects(CLAIMS)[0], "fabric")[0]
    assert alloc.ready and alloc.served == "gpu-1"
