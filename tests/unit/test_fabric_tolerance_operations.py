"""The fabric client tolerates every standard way a Redfish service answers an
operation, against a real local server: POST 200/201/202/204, a DSP0266 task
monitor polled until it stops answering 202, a Task in each of the 13
TaskStates, DELETE 200/202/204, a non-JSON error body, ``$expand`` absent,
refused or ignored; and both attach dialects send what the contract says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from driver.errors import FabricApiError, FabricMalformed, FabricNotFound
from driver.fabricclient.attachment import idempotency_key
from tests.unit.fabric_standard_server import (
    FAB,
    ROOT,
    MockupServer,
    contract_tree,
    error,
    serving,
)

CONNS = f"{FAB}/Connections"
MONITOR = f"{ROOT}/TaskService/TaskMonitors/9"
STATES = ["New", "Starting", "Running", "Suspended", "Interrupted", "Pending", "Stopping",
          "Completed", "Killed", "Exception", "Service", "Cancelling", "Cancelled"]  # fmt: skip


def conn_body(ident: str, target: str = "gpu-0", state: str = "Enabled") -> dict[str, Any]:
    return {
        "@odata.id": f"{CONNS}/{ident}", "Id": ident, "Status": {"State": state},
        "Links": {"InitiatorEndpoints": [{"@odata.id": f"{FAB}/Endpoints/ini"}],
                  "TargetEndpoints": [{"@odata.id": f"{FAB}/Endpoints/{target}"}]},
    }  # fmt: skip


def monitor(polls: list[int], final: tuple[int, Any]) -> Any:
    """A task monitor that answers 202 (a Running Task) until ``final``."""

    async def handle(request: web.Request) -> web.Response:
        polls.append(1)
        if len(polls) < 3:
            task = {"@odata.id": f"{ROOT}/TaskService/Tasks/9", "Id": "9", "TaskState": "Running"}
            return web.json_response(task, status=202, headers={"Location": MONITOR})
        status, body = final
        if body is None:
            return web.Response(status=status)
        return web.json_response(body, status=status)

    return handle


@pytest.mark.parametrize("status", [200, 201, 204])
async def test_post_answered_at_once_needs_no_wait(status: int) -> None:
    async def post(request: web.Request) -> web.Response:
        if status == 204:
            return web.Response(status=204)
        headers = {"Location": f"{CONNS}/5"} if status == 201 else {}
        return web.json_response(conn_body("5"), status=status, headers=headers)

    server = MockupServer(bodies=contract_tree(), routes={("POST", CONNS): post})
    async with serving(server) as fc:
        result = await fc.attach("gpu-0", "node-a", "adapter0")
    assert result.task is None
    assert result.connection_uri == ("" if status == 204 else f"{CONNS}/5")
    (posted,) = [h for m, p, h in server.requests if m == "POST"]
    assert posted["Idempotency-Key"] == idempotency_key("gpu-0", "node-a", "adapter0", "#0")


async def test_202_task_monitor_is_polled_until_it_stops_answering_202() -> None:
    polls: list[int] = []

    async def post(request: web.Request) -> web.Response:
        body = {"@odata.id": f"{ROOT}/TaskService/Tasks/9", "Id": "9", "TaskState": "New"}
        return web.json_response(body, status=202, headers={"Location": MONITOR})

    routes = {("POST", CONNS): post, ("GET", MONITOR): monitor(polls, (201, conn_body("5")))}
    async with serving(MockupServer(bodies=contract_tree(), routes=routes)) as fc:
        result = await fc.attach("gpu-0", "node-a", "adapter0")
        assert result.task is not None and result.task.uri == MONITOR
        assert result.task.state == "New" and not result.task.done
        done = await fc.wait(result.task.uri, timeout_s=10, interval_s=0.01)
    assert done.state == "Completed" and not done.failed and len(polls) == 3
    assert (done.operation, done.device) == ("attach", "gpu-0")


async def test_monitor_ending_in_an_error_answer_is_a_failed_operation() -> None:
    polls: list[int] = []
    final = (409, error("Base.ResourceInUse", "gpu-0 is attached to node-b"))
    routes = {("GET", MONITOR): monitor(polls, final)}
    async with serving(MockupServer(bodies=contract_tree(), routes=routes)) as fc:
        task = await fc.wait(MONITOR, timeout_s=10, interval_s=0.01)
    assert task.failed and task.messages == ("gpu-0 is attached to node-b",)


async def test_a_handle_gone_is_not_found() -> None:
    async with serving(MockupServer(bodies=contract_tree())) as fc:
        with pytest.raises(FabricNotFound):
            await fc.wait(MONITOR, timeout_s=5, interval_s=0.01)


@pytest.mark.parametrize("state", STATES)
async def test_every_task_state(state: str) -> None:
    uri = f"{ROOT}/TaskService/Tasks/7"
    body = {"@odata.id": uri, "Id": "7", "TaskState": state, "Messages": [{"Message": "m"}]}
    async with serving(MockupServer(bodies={**contract_tree(), uri: body})) as fc:
        task = await fc.task(uri)
    assert task.state == state and task.messages == ("m",)
    assert task.done == (state in ("Completed", "Killed", "Exception", "Cancelled"))
    assert task.failed == (state in ("Killed", "Exception", "Cancelled"))


@pytest.mark.parametrize("status", [200, 202, 204])
async def test_delete_answers(status: int) -> None:
    tree = contract_tree()
    tree[CONNS] = {"@odata.id": CONNS, "Members": [{"@odata.id": f"{CONNS}/5"}]}
    tree[f"{CONNS}/5"] = conn_body("5")
    polls: list[int] = []

    async def delete(request: web.Request) -> web.Response:
        tree[CONNS] = {"@odata.id": CONNS, "Members": []}  # the manager's state: detached
        del tree[f"{CONNS}/5"]
        if status == 202:
            task = {"@odata.id": f"{ROOT}/TaskService/Tasks/9", "Id": "9", "TaskState": "Running"}
            return web.json_response(task, status=202, headers={"Location": MONITOR})
        return web.Response(status=204) if status == 204 else web.json_response({}, status=200)

    routes = {("DELETE", f"{CONNS}/5"): delete, ("GET", MONITOR): monitor(polls, (204, None))}
    server = MockupServer(routes=routes)
    server.bodies = tree  # the handler changes what the server serves
    async with serving(server) as fc:
        assert (await fc.device("gpu-0")).in_use
        task = await fc.detach("gpu-0")
        assert task is not None and task.operation == "detach"
        done = await fc.wait(task.uri, timeout_s=10, interval_s=0.01)
    assert done.state == "Completed" and len(polls) == (3 if status == 202 else 0)


async def test_a_non_json_error_body_is_shown_with_its_status() -> None:
    async def post(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html><body>502 Bad Gateway</body></html>")

    server = MockupServer(bodies=contract_tree(), routes={("POST", CONNS): post})
    async with serving(server) as fc:
        with pytest.raises(FabricApiError) as caught:
            await fc.attach("gpu-0", "node-a", "adapter0")
    assert not isinstance(caught.value, FabricMalformed)
    assert caught.value.status == 502 and "502 Bad Gateway" in str(caught.value)
    assert "HTTP 502" in str(caught.value)


async def test_cxl_memory_attach_is_a_memory_connection_with_its_chunks() -> None:
    posted: list[dict[str, Any]] = []

    async def post(request: web.Request) -> web.Response:
        posted.append(await request.json())
        return web.json_response(conn_body("6", "cxl-0"), status=201)

    server = MockupServer(bodies=contract_tree(), routes={("POST", CONNS): post})
    async with serving(server) as fc:
        await fc.attach("cxl-0", "node-a", "adapter0", key="claim-uid-1")
    (body,) = posted
    assert body["ConnectionType"] == "Memory"
    chunks = [c["MemoryChunk"]["@odata.id"] for c in body["MemoryChunkInfo"]]
    assert chunks == [f"{ROOT}/Chassis/box/MemoryDomains/cxl-0/MemoryChunks/0"]
    assert body["Links"]["TargetEndpoints"] == [{"@odata.id": f"{FAB}/Endpoints/cxl-0"}]
    gpu_server = MockupServer(bodies=contract_tree(), routes={("POST", CONNS): post})
    async with serving(gpu_server) as fc:
        await fc.attach("gpu-0", "node-a", "adapter0")
    assert "ConnectionType" not in posted[1]  # a PCIe device: no type


async def test_zones_dialect_patches_the_host_zone_with_if_match() -> None:
    zone = f"{FAB}/Zones/z-ini"
    tree = contract_tree()
    patches: list[tuple[str, list[str]]] = []

    async def patch(request: web.Request) -> web.Response:
        members = [e["@odata.id"] for e in (await request.json())["Links"]["Endpoints"]]
        patches.append((request.headers.get("If-Match", ""), members))
        new = {"Endpoints": [{"@odata.id": m} for m in members]}
        server.bodies[zone] = {**server.bodies[zone], "Links": new}
        return web.Response(status=204)

    server = MockupServer(bodies=tree, routes={("PATCH", zone): patch})
    async with serving(server, dialect="zones") as fc:
        result = await fc.attach("nvme-0", "node-a", "adapter0")
        assert result.task is None and result.connection_uri == zone
        conn = (await fc.device("nvme-0")).connection
        assert conn is not None and (conn.node, conn.adapter, conn.state) == (
            "node-a", "adapter0", "Attached",
        )  # fmt: skip
        detached = await fc.detach("nvme-0")
        assert detached is not None and (await fc.wait(detached.uri, 5)).state == "Completed"
        assert (await fc.device("nvme-0")).connection is None
    ini, nvme = f"{FAB}/Endpoints/ini", f"{FAB}/Endpoints/nvme-0"
    assert patches == [('W/"1"', [ini, nvme]), ('W/"1"', [ini])]
    assert server.paths("POST") == []  # no Connections in this dialect


@pytest.mark.parametrize("expand", ["absent", "refuse", "ignore", "honour"])
async def test_expand_absent_refused_or_ignored(expand: str) -> None:
    tree = contract_tree()
    if expand == "absent":
        tree[ROOT] = {k: v for k, v in tree[ROOT].items() if k != "ProtocolFeaturesSupported"}
    server = MockupServer(bodies=tree, expand="honour" if expand == "absent" else expand)
    async with serving(server) as fc:
        first = await fc.inventory()
        second = await fc.inventory()
    assert first == second and {d.id for d in first.devices} == {
        "gpu-0", "nic-0", "nvme-0", "cxl-0",
    }  # fmt: skip
    asked = [p for p in server.paths() if "$expand" in p]
    if expand == "absent":
        assert asked == []
    elif expand == "refuse":  # asked once, then never again
        assert asked == [f"{ROOT}/Fabrics?$expand=."]
    else:
        assert len(asked) >= 4  # every collection, each read
    fetched = [p for p in server.paths() if p == f"{FAB}/Endpoints/gpu-0"]
    assert len(fetched) == (0 if expand == "honour" else 2)  # once per read, never twice


def test_idempotency_key_is_deterministic() -> None:
    key = idempotency_key("gpu-0", "node-a", "adapter0", "uid")
    assert key == idempotency_key("gpu-0", "node-a", "adapter0", "uid")
    assert key != idempotency_key("gpu-0", "node-a", "adapter1", "uid")
    assert json.dumps(key).isascii() and len(key) == 32


async def test_202_without_location_follows_the_task_resource() -> None:
    task_uri = f"{ROOT}/TaskService/Tasks/4"
    states = ["Running", "Running", "Completed"]

    async def post(request: web.Request) -> web.Response:
        return web.json_response({"@odata.id": task_uri, "Id": "4", "TaskState": "New"}, status=202)

    async def task(request: web.Request) -> web.Response:
        state = states.pop(0) if len(states) > 1 else states[0]
        return web.json_response({"@odata.id": task_uri, "Id": "4", "TaskState": state})

    routes = {("POST", CONNS): post, ("GET", task_uri): task}
    async with serving(MockupServer(bodies=contract_tree(), routes=routes)) as fc:
        result = await fc.attach("gpu-0", "node-a", "adapter0")
        assert result.task is not None and result.task.uri == task_uri
        done = await fc.wait(result.task.uri, timeout_s=10, interval_s=0.01)
    assert done.state == "Completed" and done.id == "4" and states == ["Completed"]
