"""A broken fabric resource that no claim touches is still told (issue 35).

The fabric's reads keep what they could read and record what they could not
(``FabricInventory.broken``). With no claim on the fabric at all, each broken
resource is a ``FabricResourceBroken`` Warning on the controller's leader
Lease naming the URI, the error and the device it holds back, once per
breakage however many reads see it (no Event storm), again once it broke
anew after a whole read; the rest of the fabric stays published. The real
reconciler on the shipped in-memory API and fabric
(tests/unit/controller_world.py), driven by its own fabric loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from driver.controller.reconciler import Reconciler
from driver.fabricclient.model import FabricInventory
from driver.kube.events import EVENTS_V1
from tests.unit.controller_world import Fabric, World, running, settings

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
EVENTS = f"{EVENTS_V1}/namespaces/kube-system/events"
ENDPOINT = "/redfish/v1/Fabrics/pcie0/Endpoints/gpu-1"
PORT = "/redfish/v1/Fabrics/pcie0/Switches/sw0/Ports/p9"
WHY = f"fabric GET {ENDPOINT}: HTTP 500 InternalError: endpoint store offline"


class Breaking(Fabric):
    """The world's fabric, whose reads find the resources in ``broken`` broken
    (an endpoint's breakage holds its device back, as the client does)."""

    def __init__(self, world: World) -> None:
        super().__init__(list(world.fabric.devices.values()), world)
        self.broken: dict[str, str] = {}
        self.reads = 0

    async def inventory(self) -> FabricInventory:
        whole = await super().inventory()
        self.reads += 1
        self.world.changed.changed()
        held = {
            uri.rsplit("/", 1)[1]: why for uri, why in self.broken.items() if "/Endpoints/" in uri
        }
        return dataclasses.replace(
            whole,
            devices=tuple(d for d in whole.devices if d.id not in held),
            broken=tuple(sorted(self.broken.items())),
            held_back=tuple(sorted(held.items())),
        )


def told(w: World) -> list[dict[str, Any]]:
    return [e for e in w.api.objects(EVENTS) if e["reason"] == "FabricResourceBroken"]


async def test_a_broken_resource_no_claim_touches_is_told_on_the_lease_once_per_breakage() -> None:
    w = World(2)
    fabric = Breaking(w)
    w.fabric = fabric
    lease = w.api.add(LEASES, {"metadata": {"name": "patchbay-controller"}})
    rec = Reconciler(w.api, fabric, settings(fabric_pool_shape="per-node"))

    async def read_once() -> None:
        want = fabric.reads + 1
        rec.refresh_fabric()
        await w.changed.until(f"fabric read {want}", lambda: fabric.reads >= want)

    async def reads(n: int) -> None:
        """``n`` more reads, each one seen whole by the reconciler before the next."""
        for _ in range(n):
            await read_once()
        await rec.recorder.drain()

    async with running(rec):
        await w.changed.until("both GPUs published", lambda: len(w.devices()) == 2)
        fabric.broken = {ENDPOINT: WHY}
        await reads(4)  # three reads with the endpoint broken, the last one seen
        (event,) = told(w)
        assert event["type"] == "Warning" and event["action"] == "WatchFabric"
        assert event["regarding"] == {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "name": "patchbay-controller", "namespace": "kube-system",
            "uid": lease["metadata"]["uid"],
        }  # fmt: skip
        assert event["note"] == (
            f"fabric resource {ENDPOINT} is broken: {WHY}; holds back gpu-1 (kept as last "
            "seen); the rest of the fabric is offered and attached"
        )
        assert "series" not in event, "told once per read, not once per breakage"
        assert len(w.devices()) == 2  # gpu-0 offered; gpu-1 kept as last seen
        # A second resource breaks: told once, the first not again.
        fabric.broken = {ENDPOINT: WHY, PORT: f"fabric GET {PORT}: HTTP 404 (empty body)"}
        await reads(3)
        assert [e["note"].split(";")[0] for e in told(w)] == [
            f"fabric resource {ENDPOINT} is broken: {WHY}",
            f"fabric resource {PORT} is broken: fabric GET {PORT}: HTTP 404 (empty body)",
        ]
        assert "holds back no device" in told(w)[1]["note"]
        assert all("series" not in e for e in told(w))
        # Read whole, then broken again: a new breakage, told again.
        fabric.broken = {}
        await reads(2)
        fabric.broken = {ENDPOINT: WHY}
        await reads(2)
        first = told(w)[0]
        assert first["series"]["count"] == 2
        assert len(told(w)) == 2
    assert fabric.detached == []
