"""One attach request per allocation across the controller's crash points, in both pool shapes.

The controller is killed at each crash point of an attach
(``driver.faults.CONTROLLER_POINTS``): right after the fabric answered the
attach request (nothing recorded), and once the operation handle is on the
claim while the fabric's task runs. A new incarnation finishes the attach
without asking the fabric again, whether the allocation names a per-node
variant (``per-node``) or a device published once in its reach domain's
pool, placed on the node the scheduler picked (``per-domain``). The real
reconciler and workers run on the shipped in-memory API and fabric
(tests/unit/controller_world.py), whose attach tasks end only when the test
says; the kill is the crash point itself: the attach task ends there and
that incarnation runs no pass again (the e2e tier kills the process:
tests/e2e/test_fabric_attach_once_e2e.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from driver.controller import claims as cl
from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import READY_CONDITION, device_name, variant_name
from driver.faults import CONTROLLER_POINTS
from driver.kube.api import RESOURCE_V1
from tests.unit.controller_world import World, running, settings

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"


def claim(shape: str) -> dict[str, Any]:
    """gpu-0 allocated on node-a: its per-node variant, or its one name in sw0's domain pool."""
    once = shape == "per-domain"
    name = device_name("GPU-0") if once else variant_name("GPU-0", "node-a", "adapter0")
    result = {"request": "gpu", "driver": "patchbay.dev",
              "pool": "fabric/pcie0.sw0" if once else "fabric", "device": name,
              "bindingConditions": [READY_CONDITION]}  # fmt: skip
    allocation: dict[str, Any] = {"devices": {"results": [result]}}
    if once:
        allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}  # fmt: skip
    return {"metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
            "status": {"allocation": allocation}}  # fmt: skip


def allocation(w: World) -> cl.FabricAllocation:
    (stored,) = w.api.objects(CLAIMS)
    (a,) = cl.fabric_allocations(stored, "fabric")
    return a


@pytest.mark.parametrize("shape", ["per-node", "per-domain"])
@pytest.mark.parametrize("point", CONTROLLER_POINTS)
async def test_an_attach_killed_at_a_crash_point_is_asked_once(
    shape: str, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(1)
    w.fabric.instant = False  # the attach's task runs until the test finishes it
    asked: list[tuple[str, str, str]] = []
    attach = w.fabric.attach

    async def counted(device_id: str, node: str, adapter: str, key: str = "") -> Any:
        asked.append((device_id, node, adapter))
        return await attach(device_id, node, adapter, key)

    w.fabric.attach = counted  # type: ignore[method-assign]
    following = asyncio.Event()  # an attach waits for the fabric's task
    wait = w.fabric.wait

    async def followed(task_uri: str, timeout_s: float, interval_s: float = 0.2) -> Any:
        following.set()
        return await wait(task_uri, timeout_s, interval_s)

    w.fabric.wait = followed  # type: ignore[method-assign]
    w.api.add(CLAIMS, claim(shape))
    first = Reconciler(w.api, w.fabric, settings(fabric_pool_shape=shape))
    killed = asyncio.Event()

    def crash_point(name: str) -> None:
        if name == point and not killed.is_set():
            killed.set()
            first.reconcile = lambda: None  # type: ignore[method-assign]  # it runs no pass again
            raise asyncio.CancelledError  # the attach dies here, nothing after it runs

    monkeypatch.setattr("driver.controller.attach.connect.crash_point", crash_point)
    async with running(first):
        async with asyncio.timeout(5.0):
            await killed.wait()
    assert asked == [("gpu-0", "node-a", "adapter0")] and not allocation(w).ready
    assert bool(allocation(w).operation) == (point == "fabric-attach-waiting")
    assert not following.is_set()
    # The next incarnation follows the fabric's task, still running; then it ends.
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape=shape))):
        async with asyncio.timeout(5.0):
            await following.wait()
        (task,) = w.fabric.tasks
        w.fabric.finish(task)
        await w.report()
        await w.changed.until("the claim Ready", lambda: allocation(w).ready)
    assert asked == [("gpu-0", "node-a", "adapter0")]  # asked once, never again
    assert w.fabric.devices["gpu-0"].connection is not None
