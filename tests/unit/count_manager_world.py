"""A count-based fabric manager's world for unit tests: the in-memory API, a
manager that picks the device itself (as a count dialect does) and node-a's
plugin reporting what is attached once it is live.

Why: the count-based tests (a restart between the manager's answer and the
claim's status, spares, switches) drive the real reconciler over the same
world; it lives here once, not in one of those tests."""

from __future__ import annotations

import asyncio
from typing import Any

from driver.controller import claims as cl
from driver.controller.pool.domain_slots import domain_slot_id
from driver.controller.pool.domains import LABEL_PREFIX
from driver.controller.pool.slots import slot_id
from driver.errors import CountAttachFailed
from driver.fabric_devices.naming import (
    NODE_ANNOTATION,
    READY_CONDITION,
    NodeFabric,
    device_name,
    variant_name,
)
from driver.fabricclient.dialect_count import (
    CountAttachResult,
    CountResource,
)
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import (
    AttachResult,
    FabricDevice,
    HostAdapter,
)
from driver.kube.api import RESOURCE_V1
from driver.kube.memory import MemoryKube
from tests.signals import Signal

H100 = "H100-SXM5-80GB"
A0 = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
SLOT = variant_name(slot_id("sw0", H100, "node-a", "adapter0", 0), "node-a", "adapter0")
# The per-domain shape: the same slot published once, in sw0's reach domain.
DOMAIN_POOL = "fabric/pcie0.sw0"
DOMAIN_SLOT = device_name(domain_slot_id(DOMAIN_POOL, "fabric", "sw0", H100, 0))
DOMAIN_LABEL = LABEL_PREFIX + "pcie0.sw0"
CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"


def gpu(i: int) -> FabricDevice:
    return FabricDevice(
        f"gpu-{i}", "pcie0", "sw0", "gpu", H100, f"S{i}", f"GPU-{i}", 0x10DE, 0x2330,
        "OK", True, False, (A0,), None,
    )  # fmt: skip


def claim(shape: str = "per-node", node: str = "node-a") -> dict[str, Any]:
    """A claim allocated slot 0 of sw0's H100s: the per-node slot of node-a's
    adapter0, or (``per-domain``) the domain's slot on ``node``, which the
    allocation's ``nodeSelector`` names as the scheduler writes it."""
    once = shape == "per-domain"
    result = {"request": "gpu", "driver": "patchbay.dev",
              "pool": DOMAIN_POOL if once else "fabric", "device": DOMAIN_SLOT if once else SLOT,
              "bindingConditions": [READY_CONDITION]}  # fmt: skip
    allocation: dict[str, Any] = {"devices": {"results": [result]}}
    if once:
        allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip
    return {
        "metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": allocation},
    }


class World:
    """The API, a count-based manager, and node-a's plugin (its ``adapters``,
    adapter -> pcieRoot), which reports what is attached once ``live`` (until
    then it has not seen the device yet); every Node carries sw0's reach label."""

    def __init__(
        self, devices: list[FabricDevice], adapters: dict[str, str], live: bool = False,
        more: dict[str, dict[str, str]] | None = None,
    ) -> None:  # fmt: skip
        self.api, self.changed, self.live = MemoryKube(), Signal(), live
        self.nodes = {"node-a": adapters, **(more or {})}  # node -> its adapters
        self.fabric = Manager(devices, self)
        for node, ads in self.nodes.items():
            self.api.add("/api/v1/nodes", {"metadata": {
                "name": node, "labels": {DOMAIN_LABEL: ""},
                "annotations": {NODE_ANNOTATION: NodeFabric(ads).to_annotation()}}})  # fmt: skip
        self.api.on_store = lambda _path, _obj: self.changed.changed()

    async def report(self) -> None:
        if not self.live:
            return
        for node, adapters in self.nodes.items():
            conns = [(d, c) for d in self.fabric.devices.values()
                     if (c := d.connection) is not None and c.node == node]  # fmt: skip
            seen = NodeFabric(
                adapters,
                gpus={d.uuid: c.adapter for d, c in conns},
                serials={d.serial: d.uuid for d, _ in conns},
            )
            ann = {"metadata": {"annotations": {NODE_ANNOTATION: seen.to_annotation()}}}
            await self.api.merge_patch(f"/api/v1/nodes/{node}", ann)

    def entry(self) -> dict[str, Any]:
        (stored,) = self.api.objects(CLAIMS)
        return next(iter((stored.get("status") or {}).get("devices") or ()), {})

    def ready(self) -> bool:
        (stored,) = self.api.objects(CLAIMS)
        return any(a.ready for a in cl.fabric_allocations(stored, "fabric"))


class Manager(MemoryFabric):
    """A count-based manager: a scale-up attaches the last free device of the
    model asked for that the node reaches, on whichever switch (not the one
    asked through); ``lose_answers``: the controller dies before it reads the
    answer; ``answer``: when set, each answer waits for it (the device is
    attached and reported meanwhile, as a real manager's is before it answers)."""

    picks_devices = True  # as a count dialect: the manager picks the device

    def __init__(self, devices: list[FabricDevice], world: World) -> None:
        super().__init__(devices)
        self.world, self.scale_ups, self.lose_answers = world, 0, False
        self.answer: asyncio.Event | None = None
        self.lost = False  # an answer was lost: the controller is gone from then on
        self.wrong_next = 0  # scale-ups still to bring another model (given back at once)

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        self.scale_ups += 1
        model = self.devices[device_id].model
        if self.wrong_next:  # as the count dialect tells it (dialect_count.CountDialect.attach)
            self.wrong_next -= 1
            raise CountAttachFailed(502, "WrongDevice", f"asked one gpu of model {model} for "
                                    f"node {node}: gpu OTHER serial X arrived instead; scaled it "
                                    "down again")  # fmt: skip
        free = [d for _, d in sorted(self.devices.items()) if d.connection is None]
        reached = {d.id: a.adapter for d in free for a in d.adapters if a.node == node}
        picked = [d for d in free if d.model == model and d.id in reached][-1]
        await super().attach(picked.id, node, reached[picked.id], key)
        await self.world.report()
        self.world.changed.changed()
        if self.lose_answers:
            self.lost = True
            await asyncio.Event().wait()  # cancelled: the controller is gone
        if self.answer is not None:
            await self.answer.wait()
        arrived = CountResource(f"res-{picked.id}", picked.serial, "gpu", picked.model, "OK")
        return CountAttachResult(f"/machines/m#res-{picked.id}", None, arrived)

    async def detach(self, device_id: str) -> Any:
        if self.lose_answers and self.lost:
            await asyncio.Event().wait()  # the controller died with the answer: it asks no more
        task = await super().detach(device_id)
        await self.world.report()
        return task
