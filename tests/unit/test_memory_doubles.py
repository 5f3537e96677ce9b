"""The shipped in-memory doubles behave as the tests using them assume: the
Kubernetes API (``driver.kube.memory``) and the fabric (``driver.fabricclient.memory``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from driver.errors import ApiStatusError, FabricConflict, FabricNotFound, FabricUnavailable
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import FabricDevice, HostAdapter
from driver.kube.api import RESOURCE_V1, claim_path, slice_path
from driver.kube.memory import MemoryKube

CLAIMS = f"{RESOURCE_V1}/namespaces/ns/resourceclaims"


def slice_body(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "driver": "patchbay.dev"}}


async def test_objects_lists_selectors_and_conflicts() -> None:
    api = MemoryKube()
    a = await api.create(slice_path(), slice_body("a", "n1"))
    await api.create(slice_path(), slice_body("b", "n2"))
    assert a["metadata"]["resourceVersion"] == "1" and a["metadata"]["uid"]
    listing = await api.get(
        slice_path(), {"fieldSelector": "spec.nodeName=n2,spec.driver=patchbay.dev"}
    )
    assert [o["metadata"]["name"] for o in listing["items"]] == ["b"]
    assert listing["metadata"]["resourceVersion"] == "2"
    with pytest.raises(ApiStatusError) as exists:
        await api.create(slice_path(), slice_body("a", "n1"))
    assert exists.value.conflict
    stale = {**a, "spec": {"nodeName": "n3"}}
    await api.replace(slice_path("a"), stale)  # a's version is current: accepted
    with pytest.raises(ApiStatusError) as conflict:
        await api.replace(slice_path("a"), stale)  # now it is stale
    assert conflict.value.conflict
    await api.delete(slice_path("a"))
    with pytest.raises(ApiStatusError) as gone:
        await api.get(slice_path("a"))
    assert gone.value.not_found
    assert api.writes == 4 and ("GET", slice_path("a")) in api.requests


async def test_status_is_a_subresource() -> None:
    api = MemoryKube()
    api.add(CLAIMS, {"metadata": {"name": "c", "uid": "u-1"}, "spec": {"x": 1}})
    path = claim_path("ns", "c")
    patched = await api.merge_patch(path + "/status", {"status": {"ok": True}, "spec": {"x": 9}})
    assert patched["status"] == {"ok": True} and patched["spec"] == {"x": 1}
    replaced = await api.replace(path, {"metadata": {"name": "c"}, "spec": {"x": 2}})
    assert replaced["status"] == {"ok": True} and replaced["metadata"]["uid"] == "u-1"
    assert replaced["metadata"]["generation"] == 2 and replaced["metadata"]["namespace"] == "ns"
    merged = await api.merge_patch(path, {"spec": {"x": None, "y": 3}})
    assert merged["spec"] == {"y": 3}


async def test_watch_from_a_version_then_live_until_ended() -> None:
    api = MemoryKube()
    await api.create(slice_path(), slice_body("a", "n1"))
    since = (await api.get(slice_path()))["metadata"]["resourceVersion"]
    seen: list[tuple[str, str]] = []

    async def follow() -> None:
        async for event in api.watch(slice_path(), {"resourceVersion": since}):
            seen.append((event["type"], event["object"]["metadata"]["name"]))

    task = asyncio.create_task(follow())
    await asyncio.sleep(0)
    await api.create(slice_path(), slice_body("b", "n1"))
    await api.delete(slice_path("a"))
    await asyncio.sleep(0)
    api.end_watches()
    await asyncio.wait_for(task, 5)
    assert seen == [("ADDED", "b"), ("DELETED", "a")]


async def test_pause_and_injected_failures() -> None:
    api = MemoryKube()
    release = api.pause(slice_path())
    listing = asyncio.ensure_future(api.get(slice_path()))
    await asyncio.sleep(0)  # one turn: the list runs until it has to wait
    assert ("GET", slice_path()) in api.requests and not listing.done()
    release.set()
    assert (await listing)["items"] == []
    api.fail("POST", slice_path(), 500)
    with pytest.raises(ApiStatusError) as failed:
        await api.create(slice_path(), slice_body("a", "n"))
    assert failed.value.status == 500
    await api.create(slice_path(), slice_body("a", "n"))  # only once


ADAPTER = HostAdapter("n-a0", "pcie0", "sw0", "node-a", "adapter0")
OTHER = HostAdapter("m-a0", "pcie0", "sw0", "node-b", "adapter0")
GPU = FabricDevice("gpu-0", "pcie0", "sw0", "gpu", "H100", "S1", "GPU-0", 0x10DE, 0x2330,
                   "OK", True, False, (ADAPTER, OTHER), None)  # fmt: skip


async def test_fabric_attach_detach_and_conflicts() -> None:
    fabric = MemoryFabric([GPU])
    events = fabric.events()
    assert await anext(events) == []  # subscribed
    first = await fabric.attach("gpu-0", "node-a", "adapter0")
    assert first.task is None and fabric.attached == [("gpu-0", "node-a", "adapter0")]
    conn = (await fabric.device("gpu-0")).connection
    assert conn is not None and conn.state == "Attached" and conn.pci_bus_id
    assert (
        await fabric.attach("gpu-0", "node-a", "adapter0")
    ).connection_uri == first.connection_uri
    with pytest.raises(FabricConflict):
        await fabric.attach("gpu-0", "node-b", "adapter0")
    with pytest.raises(FabricNotFound):
        await fabric.attach("gpu-0", "node-c", "adapter0")
    assert await asyncio.wait_for(anext(events), 1)  # the attach was signalled
    task = await fabric.detach("gpu-0")
    assert task is not None and task.done and not task.failed
    assert await fabric.detach("gpu-0") is None and fabric.detached == ["gpu-0"]
    await events.aclose()


async def test_fabric_tasks_finish_when_told() -> None:
    fabric = MemoryFabric([GPU], instant=False)
    result = await fabric.attach("gpu-0", "node-a", "adapter0")
    assert result.task is not None and result.task.state == "Running"
    waiting = asyncio.ensure_future(fabric.wait(result.task.uri, 5))
    await asyncio.sleep(0)
    assert not waiting.done()
    fabric.finish(result.task.uri, ok=False, message="link training failed")
    done = await waiting
    assert done.failed and done.messages == ("link training failed",)
    assert (await fabric.device("gpu-0")).connection is None
    fabric.fail("inventory", FabricUnavailable("down"))
    with pytest.raises(FabricUnavailable):
        await fabric.inventory()
    assert len((await fabric.inventory()).devices) == 1
