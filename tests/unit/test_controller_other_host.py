"""A device attached to a host that is not one of the cluster's nodes (issue 35).

The fabric may be shared with hosts outside the cluster: an attachment's
host is a name no Node object has (a system's ``HostName``), or "" (no node
maps to it). Such a device is neither published (a claim would take it, and
its attach would first detach it from that host) nor detached (no claim
needs it: it would look like a leftover), and a claim allocated it before
that host took it fails its attach instead of detaching it from there. A
Node deleted under a running controller is still one of its nodes: what is
attached to it is detached.
The real reconciler on the shipped in-memory API and fabric
(tests/unit/controller_world.py), in both pool shapes.
"""

from __future__ import annotations

import dataclasses

import pytest

from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    NODE_ANNOTATION,
    READY_CONDITION,
    NodeFabric,
    variant_name,
)
from driver.fabricclient.model import FabricConnection, FabricDevice, HostAdapter
from driver.kube.api import RESOURCE_V1
from tests.unit.controller_world import ADAPTER, World, gpu, running, settings

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"


def attached(n: int, host: str) -> FabricDevice:
    """gpu-``n``, reachable from node-a too, attached to ``host``'s adapter."""
    theirs = HostAdapter(f"{host or 'x'}-a0", "pcie0", "sw0", host, "a0")
    conn = FabricConnection(f"c{n}", f"/c{n}", f"gpu-{n}", host, "a0", "Attached", "", None)
    return dataclasses.replace(gpu(n), adapters=(ADAPTER, theirs), connection=conn,
                               connections=(conn,), in_use=True)  # fmt: skip


def published(w: World) -> set[str]:
    """The fabric devices the pool offers (an adapter pool's entries are none)."""
    attrs = [d["attributes"] for d in w.devices().values()]
    return {a["fabricDevice"]["string"] for a in attrs if "fabricDevice" in a}


@pytest.mark.parametrize("shape", ["per-node", "per-domain"])
async def test_a_device_on_a_host_that_is_no_node_is_neither_published_nor_detached(
    shape: str,
) -> None:
    w = World(1)
    for d in (attached(1, "build-box-7"), attached(2, "")):
        w.fabric.devices[d.id] = d
    labelled = {"metadata": {"labels": {"reach.fabric.patchbay.dev/pcie0.sw0": ""}}}
    await w.api.merge_patch("/api/v1/nodes/node-a", labelled)
    rec = Reconciler(w.api, w.fabric, settings(fabric_pool_shape=shape))
    async with running(rec):
        await w.changed.until("gpu-0 published", lambda: published(w) == {"gpu-0"})
        rec.reconcile()  # another pass over the same inventory: still nothing
        await rec.publisher.in_sync.wait()
        await rec.workers.stop()  # every detach it started has ended
        assert published(w) == {"gpu-0"}
    assert w.fabric.detached == []
    assert {d: w.fabric.devices[d].connection is not None for d in ("gpu-1", "gpu-2")} == {
        "gpu-1": True,
        "gpu-2": True,
    }


async def test_a_node_deleted_under_the_controller_is_still_its_own() -> None:
    """node-b holds gpu-1 prepared (kept attached), then its Node is deleted:
    gpu-1 is detached (a node whose Node object is gone holds nothing)."""
    w = World(1)
    w.fabric.devices["gpu-1"] = attached(1, "node-b")
    report = NodeFabric({"a0": "pci0000:15"}, gpus={"GPU-1": "a0"}, busy=frozenset({"GPU-1"}))
    node_b = {
        "metadata": {"name": "node-b", "annotations": {NODE_ANNOTATION: report.to_annotation()}}
    }
    w.api.add("/api/v1/nodes", node_b)
    rec = Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))
    async with running(rec):
        await w.changed.until("both published", lambda: published(w) == {"gpu-0", "gpu-1"})
        rec.reconcile()
        assert w.fabric.detached == []  # prepared on node-b
        await w.api.delete("/api/v1/nodes/node-b")
        await w.changed.until("gpu-1 detached", lambda: w.fabric.detached == ["gpu-1"])


async def test_a_claim_whose_device_another_host_took_fails_and_takes_it_from_no_one() -> None:
    """gpu-1 is published; a host outside the cluster takes it; a claim the
    scheduler allocated it before that fails its attach: nothing detached."""
    w = World(2)
    rec = Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))
    taken = variant_name("GPU-1", "node-a", "adapter0")
    claim = {
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": taken,
             "bindingConditions": [READY_CONDITION],
             "bindingFailureConditions": [FAILED_CONDITION]},
        ]}}},
    }  # fmt: skip

    def failed() -> str:
        (stored,) = w.api.objects(CLAIMS)
        conds = [c for d in stored["status"].get("devices") or () for c in d["conditions"]]
        return next((c["message"] for c in conds
                     if c["type"] == FAILED_CONDITION and c["status"] == "True"), "")  # fmt: skip

    async with running(rec):
        await w.changed.until("both published", lambda: published(w) == {"gpu-0", "gpu-1"})
        w.fabric.devices["gpu-1"] = attached(1, "build-box-7")
        rec.refresh_fabric()
        await w.changed.until("gpu-1 withdrawn", lambda: published(w) == {"gpu-0"})
        w.api.add(CLAIMS, claim)
        await w.changed.until("the claim failed", lambda: bool(failed()))
        assert "gpu-1 is attached to build-box-7, not a node of this cluster" in failed()
    assert w.fabric.detached == [] and w.fabric.attached == []
    conn = w.fabric.devices["gpu-1"].connection
    assert conn is not None and conn.node == "build-box-7"
