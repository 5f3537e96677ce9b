"""The controller never adopts a zone member whose connection is not done (issue 33).

In the CI run of issue 33 the zones dialect reported a member still
attaching (its task had crashed) as Attached, and the controller, seeing
the device's connection on the allocation's node and adapter, took it as
"already attached" and waited on a device that never came. Here the real
connector runs against the in-process fabric service through the zones
client: an earlier request's attach is held by the service (a long attach
latency), and a new allocation of the device must follow it to its end
(asking nothing again), not adopt it at once; a failed member is asked
again, and the fabric clears it and attaches anew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from driver.controller import claims as cl
from driver.controller.attach.connect import Connector
from driver.controller.attach.status import ClaimStatusWriter
from driver.fabricclient import FabricClient
from driver.fabricclient.model import FabricInventory
from driver.fabricclient.protocol import FabricApi
from driver.kube.memory import MemoryKube
from tests.unit.fabric_objects import VARIANT
from tests.unit.fabric_service import Env, break_the_next_attach, fabric_env

# A spare-like allocation (no claim name): nothing is written to a claim.
ALLOC = cl.FabricAllocation("uid-2", "", "", VARIANT.name, ready=False, failed=False)


class Watched:
    """The zones client, counting inventory reads (one per look at the device)."""

    def __init__(self, client: FabricClient) -> None:
        self.client, self.reads = client, 0
        self.read_again = asyncio.Event()

    async def inventory(self) -> FabricInventory:
        self.reads += 1
        if self.reads >= 3:
            self.read_again.set()
        return await self.client.inventory()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with fabric_env(tmp_path, "zones") as env:
        yield env


def connector(fabric: Watched) -> Connector:
    status = ClaimStatusWriter(MemoryKube(), "fabric")
    return Connector(cast(FabricApi, fabric), status, 60.0, None)


async def test_a_zone_member_still_attaching_is_followed_not_adopted(env: Env) -> None:
    await env.faults({"attachLatencySeconds": 3600})  # held until the latency is lowered
    earlier = await env.client.attach("gpu-0", "node-a", "adapter0", key="earlier-claim")
    assert earlier.task is not None
    watched = Watched(env.client)
    deadline = time.monotonic() + 60.0
    connect = asyncio.create_task(connector(watched).connect(ALLOC, VARIANT, deadline))
    read_again = asyncio.create_task(watched.read_again.wait())
    # Hang guard only: either the connector is still looking at the device
    # after its third read, or (the bug) it returned at once, adopting it.
    await asyncio.wait({connect, read_again}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    assert read_again.done() and not connect.done()
    await env.faults({"attachLatencySeconds": 0})
    await asyncio.wait_for(connect, 60)
    conn = (await env.client.device("gpu-0")).connection
    assert conn is not None and conn.state == "Attached"
    status, audit = await env.raw("GET", "/patchbay/v1/audit")
    assert status == 200 and [a["target"] for a in audit["attachRequests"]] == ["gpu-0"]


async def test_a_failed_zone_member_is_asked_again_and_attaches(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    break_the_next_attach(monkeypatch)
    earlier = await env.client.attach("gpu-0", "node-a", "adapter0", key="earlier-claim")
    assert earlier.task is not None
    assert (await env.client.wait(earlier.task.uri, 10, 0.02)).state == "Exception"
    conn = (await env.client.device("gpu-0")).connection
    assert conn is not None and conn.state == "Failed"
    watched = Watched(env.client)
    await connector(watched).connect(ALLOC, VARIANT, time.monotonic() + 60.0)
    conn = (await env.client.device("gpu-0")).connection
    assert conn is not None and conn.state == "Attached"
    status, audit = await env.raw("GET", "/patchbay/v1/audit")
    assert status == 200 and [a["target"] for a in audit["attachRequests"]] == ["gpu-0"] * 2
