"""A prepare's API read happens before the claim locks (driver.claims.fetch).

Why: with the apiserver or etcd down a claim GET hangs until its request
timeout; read under the lock, it held up every unprepare (which needs no API
at all) and every other pod's prepare behind it. Through the real servicer
and preparer: an unprepare completes while a prepare's read hangs, and two
prepares read at the same time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from plugin.proto import dra_v1_pb2
from plugin.servers.dra import DraServicer
from tests.claims_doubles import NODE, FlakyHandler, Reader

BOUND = 10.0  # a liveness bound for a call that must not wait, not a timing


class GatedReader(Reader):
    """Reads of the names in ``held`` wait for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.waiting: set[str] = set()
        self.release = asyncio.Event()
        self.arrived = asyncio.Condition()

    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        if name in self.held:
            async with self.arrived:
                self.waiting.add(name)
                self.arrived.notify_all()
            await self.release.wait()
        return await super().read_claim(namespace, name)


@pytest.fixture
def servicer(tmp_path: Path) -> tuple[GatedReader, DraServicer]:
    inv = NodeInventory()
    devices = [Device(name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}") for i in range(3)]
    inv.replace_pool(NODE, devices)
    reader = GatedReader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(
        reader, inv, {"gpu": FlakyHandler(tmp_path / "dev")}, store, CdiRegistry(tmp_path / "cdi")
    )
    return reader, DraServicer(prep, dra_v1_pb2)


def _prepare(*refs: Any) -> Any:
    return dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
    )


def _unprepare(*refs: Any) -> Any:
    return dra_v1_pb2.NodeUnprepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
    )


async def _until(reader: GatedReader, what: str, probe: Any) -> None:
    async def arrived() -> None:
        async with reader.arrived:
            await reader.arrived.wait_for(probe)

    try:
        await asyncio.wait_for(arrived(), BOUND)
    except TimeoutError:
        pytest.fail(f"never saw {what}")


async def test_an_unprepare_is_not_held_up_by_a_hanging_read(
    servicer: tuple[GatedReader, DraServicer],
) -> None:
    reader, dra = servicer
    done = reader.add("done", ["gpu-0"])
    assert (await dra.NodePrepareResources(_prepare(done), None)).claims[done.uid].error == ""
    slow = reader.add("slow", ["gpu-1"])
    reader.held.add("slow")
    pending = asyncio.ensure_future(dra.NodePrepareResources(_prepare(slow), None))
    await _until(reader, "the slow read start", lambda: "slow" in reader.waiting)
    # The API is "down" for the slow claim: the other claim still unprepares.
    try:
        resp = await asyncio.wait_for(dra.NodeUnprepareResources(_unprepare(done), None), BOUND)
    except TimeoutError:
        pytest.fail("an unprepare waited for another call's claim read")
    assert resp.claims[done.uid].error == ""
    assert not pending.done()
    reader.release.set()
    assert (await pending).claims[slow.uid].error == ""


async def test_two_prepares_read_at_the_same_time(
    servicer: tuple[GatedReader, DraServicer],
) -> None:
    reader, dra = servicer
    first, second = reader.add("first", ["gpu-0"]), reader.add("second", ["gpu-1"])
    reader.held |= {"first", "second"}
    calls = [
        asyncio.ensure_future(dra.NodePrepareResources(_prepare(ref), None))
        for ref in (first, second)
    ]
    await _until(
        reader, "both reads in flight at once", lambda: reader.waiting == {"first", "second"}
    )
    reader.release.set()
    answers = await asyncio.gather(*calls)
    assert [a.claims[r.uid].error for a, r in zip(answers, (first, second), strict=True)] == [
        "",
        "",
    ]
