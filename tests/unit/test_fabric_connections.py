"""Connections as the standard allows them, on our two-switch mockup (issue 35).

Each test failed on the client before issue 35: it kept one Connection per
device (the last), read only ``InitiatorEndpoints[0]``/``TargetEndpoints[0]``,
stopped reach at one switch, never found an endpoint the collection omits,
deleted one Connection of a device in two and reported the detach done,
and POSTed a Connection without ``@odata.type``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.unit.fabric_standard_server import MockupServer, serving
from tests.unit.fabric_two_switch import (
    CONNECTION_TYPE,
    CONNS,
    EPS,
    FAB,
    MLD_SERIAL,
    two_switch_tree,
)


def deleting(server: MockupServer, *uris: str, honour: bool = True) -> None:
    """DELETE of each of ``uris`` answers 204; ``honour``: and removes it (from its
    collection and the endpoints' links), else the manager keeps it."""

    async def delete(request: web.Request) -> web.Response:
        gone = request.path.rstrip("/")
        if honour:
            server.bodies.pop(gone)
            coll = server.bodies[CONNS]
            coll["Members"] = [m for m in coll["Members"] if m["@odata.id"] != gone]
            for body in server.bodies.values():
                links = body.get("Links", {})
                if "Connections" in links:
                    links["Connections"] = [
                        c for c in links["Connections"] if c["@odata.id"] != gone
                    ]
        return web.Response(status=204)

    server.routes |= {("DELETE", u): delete for u in uris}


async def test_a_device_in_two_connections_keeps_both_and_other_hosts_show() -> None:
    async with serving(MockupServer(bodies=two_switch_tree())) as fc:
        inv = await fc.inventory()
    mem = inv.device("mem-3")
    assert sorted((c.id, c.node, c.adapter) for c in mem.connections) == [
        ("c1", "node-a", "fa1"), ("c2", "node-a", "fa2"),
    ]  # fmt: skip
    assert mem.in_use and mem.connection is not None and mem.connection.node == "node-a"
    # ld-2: the collection omits it; Connection c3 (and its switch port) name it,
    # attached to the other host.
    ld2 = inv.device("ld-2")
    assert ld2.connection is not None and (ld2.connection.node, ld2.connection.adapter) == (
        "node-b", "fa0",
    )  # fmt: skip
    assert inv.device("ld-1").connection is None


async def test_reach_crosses_the_inter_switch_link_and_its_loop() -> None:
    async with serving(MockupServer(bodies=two_switch_tree())) as fc:
        inv = await fc.inventory()
    # Hosts on sw1, memory on sw2: every memory device reaches every adapter.
    for dev in ("ld-1", "ld-2", "mem-3"):
        d = inv.device(dev)
        assert d.switch == "sw2"
        assert sorted(a.adapter for a in d.adapters) == ["fa0", "fa1", "fa2"], dev
    assert {a.switch for a in inv.adapters} == {"sw1"}


async def test_the_lds_of_one_mld_are_told_apart_without_changing_published_names() -> None:
    async with serving(MockupServer(bodies=two_switch_tree())) as fc:
        inv = await fc.inventory()
    ld1, ld2 = inv.device("ld-1"), inv.device("ld-2")
    assert ld1.identity == ld2.identity == MLD_SERIAL  # what is published today
    assert (ld1.unique_identity, ld2.unique_identity) == (
        f"{MLD_SERIAL}:0001",
        f"{MLD_SERIAL}:0002",
    )
    # A GPU without a UUID is listed, with no identity to match on a node.
    gpu = inv.device("gpu-0")
    assert (gpu.kind, gpu.uuid, gpu.model) == ("gpu", "", "H100")


async def test_detach_removes_every_connection_and_is_done_only_when_none_is_left() -> None:
    server = MockupServer(bodies=two_switch_tree())
    deleting(server, f"{CONNS}/c1", f"{CONNS}/c2")
    async with serving(server) as fc:
        task = await fc.detach("mem-3")
        assert task is not None
        done = await fc.wait(task.uri, timeout_s=30, interval_s=0.01)
        left = (await fc.device("mem-3")).connections
    assert done.state == "Completed" and left == ()
    assert sorted(server.paths("DELETE")) == [f"{CONNS}/c1", f"{CONNS}/c2"]


async def test_a_detach_the_manager_does_not_carry_out_is_not_reported_done() -> None:
    server = MockupServer(bodies=two_switch_tree())
    deleting(server, f"{CONNS}/c1", f"{CONNS}/c2", honour=False)
    async with serving(server) as fc:
        task = await fc.detach("mem-3")
        assert task is not None
        done = await fc.wait(task.uri, timeout_s=30, interval_s=0.01)
    assert done.failed, done
    assert any("still bound to node-a" in m for m in done.messages), done.messages
    assert any(f"{CONNS}/c1" in m for m in done.messages), done.messages


async def test_attach_posts_the_connection_type_the_service_shows() -> None:
    posted: list[dict[str, Any]] = []

    async def post(request: web.Request) -> web.Response:
        posted.append(await request.json())
        return web.json_response({}, status=201, headers={"Location": f"{CONNS}/c9"})

    server = MockupServer(bodies=two_switch_tree(), routes={("POST", CONNS): post})
    async with serving(server) as fc:
        result = await fc.attach("gpu-0", "node-a", "fa1")
    (body,) = posted
    assert body["@odata.type"] == CONNECTION_TYPE
    assert body["Links"] == {
        "InitiatorEndpoints": [{"@odata.id": f"{EPS}/ini-a1"}],
        "TargetEndpoints": [{"@odata.id": f"{EPS}/gpu-0"}],
    }
    assert result.connection_uri == f"{CONNS}/c9" and result.task is None


async def test_without_connections_to_learn_from_the_type_comes_from_metadata() -> None:
    tree = two_switch_tree()
    tree[CONNS] = {**tree[CONNS], "Members": []}
    metadata = '<Reference><Include Namespace="Connection.v1_2_0"/>' \
               '<Include Namespace="Connection.v1_3_1"/></Reference>'  # fmt: skip
    posted: list[dict[str, Any]] = []

    async def post(request: web.Request) -> web.Response:
        posted.append(await request.json())
        return web.Response(status=204, headers={"Location": f"{CONNS}/c9"})

    async def meta(request: web.Request) -> web.Response:
        return web.Response(text=metadata, content_type="application/xml")

    routes = {("POST", CONNS): post, ("GET", "/redfish/v1/$metadata"): meta}
    async with serving(MockupServer(bodies=tree, routes=routes)) as fc:
        result = await fc.attach("gpu-0", "node-a", "fa1")
    assert posted[0]["@odata.type"] == "#Connection.v1_3_1.Connection"
    assert result.connection_uri == f"{CONNS}/c9"  # a 204's Location is kept


async def test_a_loop_of_links_through_a_port_no_collection_lists_ends() -> None:
    """sw2's collection omits its link port, which names itself and sw1's; sw1's
    names it back: the walk reads it once, by its URI, and stops."""
    tree = two_switch_tree()
    ports = f"{FAB}/Switches/sw2/Ports"
    isl = f"{ports}/isl"
    tree[ports] = {**tree[ports], "Members": [m for m in tree[ports]["Members"]
                                              if m["@odata.id"] != isl]}  # fmt: skip
    server = MockupServer(bodies=tree)
    async with serving(server) as fc:
        inv = await fc.inventory()
    assert sorted(a.adapter for a in inv.device("ld-1").adapters) == ["fa0", "fa1", "fa2"]
    assert server.paths().count(isl) == 1
