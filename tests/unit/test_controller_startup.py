"""The controller's first pass starts on its own, whichever input is ready last.

The reconciler waits for its claim and Node caches, the stored fabric pool
slices and the fabric inventory; each of them must wake it once ready,
because nothing else will for ``--fabric-refresh`` seconds. The shipped
in-memory API and fabric (``driver.kube.memory``, ``driver.fabricclient.memory``)
hold the inputs back; the pool published is the real one.
"""

from __future__ import annotations

import asyncio

import pytest

from driver.controller.process.settings import ControllerSettings
from driver.controller.reconciler import Reconciler, node_uuids
from driver.fabricclient.memory import MemoryFabric
from driver.kube.api import RESOURCE_V1, slice_path
from driver.kube.memory import MemoryKube
from tests.signals import LogSignal, Signal
from tests.unit.fabric_objects import GPU, node

NODE = node({})  # node-a, its adapter0 reported, nothing attached
LISTS = {
    "resourceslices": slice_path(),
    "resourceclaims": f"{RESOURCE_V1}/resourceclaims",
    "nodes": "/api/v1/nodes",
}
WAITS_FOR = {  # what the reconciler's pass says it waits for
    "resourceslices": "slices", "resourceclaims": "claims", "nodes": "nodes",
    "fabric": "fabric inventory",
}  # fmt: skip


@pytest.mark.parametrize("last", [*LISTS, "fabric"])
async def test_first_pass_publishes_whichever_input_is_ready_last(last: str) -> None:
    api, fabric = MemoryKube(), MemoryFabric([GPU])
    api.add("/api/v1/nodes", NODE)
    held = {kind: api.pause(path) for kind, path in LISTS.items()}
    held["fabric"] = fabric.pause()
    settings = ControllerSettings(
        fabric_url="http://fabric",
        fabric_token="t",
        fabric_refresh=300,
        fabric_insecure=True,
        fabric_pool_shape="per-node",  # one pool of one variant (node-a, adapter0)
    )
    rec = Reconciler(api, fabric, settings)
    stored = Signal()
    api.on_store = lambda _path, _obj: stored.changed()
    with LogSignal.on("driver.controller.reconciler") as passes:
        task = asyncio.create_task(rec.run())
        try:
            for kind, event in held.items():
                if kind != last:
                    event.set()
            # The pass that every other input woke: it waits, publishing nothing.
            waits = f"reconcile waits for: {WAITS_FOR[last]}"  # for that one only
            await passes.signal.until(waits, lambda: waits in passes.messages)
            assert api.objects(slice_path()) == []
            held[last].set()
            await stored.until("the pool published", lambda: bool(api.objects(slice_path())))
            devices = [
                d["name"] for s in api.objects(slice_path()) for d in s["spec"].get("devices") or ()
            ]
            assert len(devices) == 1 and devices[0].startswith("fgpu-")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def test_node_uuids_name_only_a_machine_one_node_runs_on() -> None:
    def node(name: str, uuid: str) -> dict[str, object]:
        return {"metadata": {"name": name}, "status": {"nodeInfo": {"systemUUID": uuid}}}

    nodes = [node("a", "U-1"), node("b", "u-2"), node("c", "U-2"), node("d", "")]
    # b and c share a machine (as simulated nodes do): neither is named by it.
    assert node_uuids(nodes) == {"u-1": "a"}
