"""A fabric manager that misbehaves, on loopback: the client keeps what it can read,
names what failed, and never sends a credential anywhere but the manager.

Each test failed on the client before issue 35 (e6a6e04): one broken
resource failed the whole inventory (and every later attach), errors named
no request, a redirect was followed to another host with the session token,
concurrent requests meeting an expired session each logged in, a task
monitor was polled for as long as the caller's timeout allowed, a body of
any size was read whole.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from driver.errors import (
    FabricApiError,
    FabricAttachConflict,
    FabricAttachRefused,
    FabricConflict,
    FabricRedirectRefused,
    FabricResourceBroken,
    FabricUnreachable,
)
from driver.fabricclient import FabricClient
from driver.fabricclient.auth import Auth, BasicAuth, OAuth2Auth, SessionAuth
from driver.fabricclient.limits import FabricLimitsSettings
from driver.fabricclient.token import TokenSource
from tests.unit.fabric_standard_server import FAB, ROOT, MockupServer, contract_tree, error, serving
from tests.unit.redfish_sessions import SESSIONS, Sessions

EPS, CONNS = f"{FAB}/Endpoints", f"{FAB}/Connections"
NIC = f"{EPS}/nic-0"


def plain_tree() -> dict[str, dict[str, Any]]:
    """The contract fabric without ``$expand``: each endpoint is its own GET."""
    tree = contract_tree()
    tree[ROOT] = {k: v for k, v in tree[ROOT].items() if k != "ProtocolFeaturesSupported"}
    return tree


def answering(status: int, body: Any = None) -> Any:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response(body or error("Base.InternalError", "boom"), status=status)

    return handle


async def created(request: web.Request) -> web.Response:
    return web.json_response({}, status=201, headers={"Location": f"{CONNS}/c1"})


async def test_a_500_on_one_endpoint_costs_that_device_only_and_attach_still_works() -> None:
    routes = {("GET", NIC): answering(500), ("POST", CONNS): created}
    async with serving(MockupServer(bodies=plain_tree(), routes=routes)) as fc:
        inv = await fc.inventory()
        result = await fc.attach("gpu-0", "node-a", "adapter0")  # unrelated to nic-0
        with pytest.raises(FabricResourceBroken) as held:
            await fc.device("nic-0")
    assert sorted(d.id for d in inv.devices) == ["cxl-0", "gpu-0", "nvme-0"]
    (uri, why), *_ = inv.broken
    assert uri == NIC and f"GET {NIC}" in why and "HTTP 500" in why
    assert dict(inv.held_back)["nic-0"].startswith(f"its endpoint {NIC} is unreadable")
    assert "held back" in str(held.value) and result.connection_uri == f"{CONNS}/c1"


async def test_a_truncated_body_is_named_and_the_rest_kept() -> None:
    async def truncated(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = 4000
        await resp.prepare(request)
        await resp.write(b'{"@odata.id": "' + NIC.encode() + b'", "Id": "nic-0", ')
        assert request.transport is not None
        request.transport.close()  # the connection ends before Content-Length
        return resp

    async with serving(MockupServer(bodies=plain_tree(), routes={("GET", NIC): truncated})) as fc:
        inv = await fc.inventory()
    assert sorted(d.id for d in inv.devices) == ["cxl-0", "gpu-0", "nvme-0"]
    assert [u for u, _ in inv.broken] == [NIC] and "cut short" in inv.broken[0][1]


async def test_connected_entities_null_is_no_entity() -> None:
    tree = plain_tree()
    tree[NIC] = {**tree[NIC], "ConnectedEntities": None}
    async with serving(MockupServer(bodies=tree)) as fc:
        inv = await fc.inventory()
    assert sorted(d.id for d in inv.devices) == ["cxl-0", "gpu-0", "nvme-0"]
    assert inv.broken == () and inv.held_back == ()


async def test_an_oversized_body_is_refused_by_the_size_setting() -> None:
    tree = contract_tree()  # $expand offered: the expanded collection is too big as well
    tree[NIC] = {**tree[NIC], "Description": "x" * 20_000}
    limits = FabricLimitsSettings(fabric_max_body_bytes=8192)
    async with serving(MockupServer(bodies=tree), limits=limits) as fc:
        inv = await fc.inventory()
    assert sorted(d.id for d in inv.devices) == ["cxl-0", "gpu-0", "nvme-0"]
    (uri, why), *_ = inv.broken
    assert uri == NIC and "over the limit of 8192 bytes" in why
    assert "fabric_max_body_bytes" in why


async def test_a_task_monitor_that_never_ends_is_bounded_by_polls() -> None:
    monitor = f"{ROOT}/TaskService/TaskMonitors/forever"
    polls: list[int] = []

    async def running(request: web.Request) -> web.Response:
        polls.append(1)
        return web.json_response({"TaskState": "Running"}, status=202)

    limits = FabricLimitsSettings(fabric_task_max_polls=4)
    server = MockupServer(bodies=plain_tree(), routes={("GET", monitor): running})
    async with serving(server, limits=limits) as fc:
        with pytest.raises(TimeoutError) as exc:
            await fc.wait(monitor, timeout_s=3600, interval_s=0.001)
    assert len(polls) == 4
    assert monitor in str(exc.value) and "after 4 polls" in str(exc.value)
    assert "fabric_task_max_polls" in str(exc.value)


async def test_a_timeout_names_the_request_and_how_long() -> None:
    release = asyncio.Event()

    async def silent(request: web.Request) -> web.Response:
        await release.wait()  # never answers while the client waits
        return web.json_response({})

    # The very first request (the service root) is the silent one: no other request
    # can time out first, however slow the machine.
    server = await MockupServer(bodies=plain_tree(), routes={("GET", ROOT): silent}).start()
    try:
        async with FabricClient(server.url, "token", timeout_s=0.3) as fc:
            with pytest.raises(FabricUnreachable) as exc:
                await fc.inventory()
    finally:
        release.set()
        await server.close()
    assert f"GET {ROOT}/: no answer within 0.3 s" in str(exc.value)


async def test_a_root_without_fabrics_is_an_empty_fabric() -> None:
    tree = contract_tree()
    tree[ROOT] = {k: v for k, v in tree[ROOT].items() if k != "Fabrics"}
    async with serving(MockupServer(bodies=tree)) as fc:
        inv = await fc.inventory()
    assert inv.devices == () and inv.adapters == ()


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(500, FabricApiError), (400, FabricAttachRefused), (409, FabricAttachConflict)],
)
async def test_attach_errors_name_the_request_and_tell_refusal_apart(
    status: int, error_type: type[Exception]
) -> None:
    routes = {("POST", CONNS): answering(status)}
    async with serving(MockupServer(bodies=contract_tree(), routes=routes)) as fc:
        with pytest.raises(FabricApiError) as exc:
            await fc.attach("gpu-0", "node-a", "adapter0")
    assert type(exc.value) is error_type
    assert f"fabric POST {CONNS}: HTTP {status} InternalError: boom" == str(exc.value)
    assert isinstance(exc.value, FabricConflict) == (status == 409)  # the controller's catch


async def test_zones_attach_of_a_device_in_another_hosts_zone_is_refused() -> None:
    tree = contract_tree()
    ini_b, zone_b = f"{EPS}/ini-b", f"{FAB}/Zones/z-b"
    system_b = f"{ROOT}/Systems/node-b"
    tree[system_b] = {"@odata.id": system_b, "Id": "node-b", "HostName": "node-b"}
    tree[ini_b] = {
        **tree[f"{EPS}/ini"], "@odata.id": ini_b, "Id": "ini-b",
        "ConnectedEntities": [{"EntityType": "RootComplex", "EntityRole": "Initiator",
                               "EntityLink": {"@odata.id": system_b}}],
        "Links": {**tree[f"{EPS}/ini"]["Links"], "LocalPorts": [
            {"@odata.id": f"{system_b}/FabricAdapters/adapter0/Ports/0"}]},
    }  # fmt: skip
    tree[zone_b] = {"@odata.id": zone_b, "Id": "z-b", "Links": {"Endpoints": [
        {"@odata.id": ini_b}, {"@odata.id": f"{EPS}/gpu-0"}]}}  # fmt: skip
    tree[f"{FAB}/Zones"]["Members"].append({"@odata.id": zone_b})
    server = MockupServer(bodies=tree)
    async with serving(server, dialect="zones") as fc:
        assert (await fc.device("gpu-0")).connection is not None
        with pytest.raises(FabricAttachConflict) as exc:
            await fc.attach("gpu-0", "node-a", "adapter0")
    assert zone_b in str(exc.value) and "node-b" in str(exc.value)
    assert server.paths("PATCH") == []  # nothing asked of the manager


async def test_a_refused_login_says_the_credentials_were_refused(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("wrong\n")
    server = await Sessions().server().start()
    try:
        auth = SessionAuth("admin", TokenSource(path=tmp_path / "pw"))
        async with FabricClient(server.url, auth) as fc:
            with pytest.raises(FabricApiError) as exc:
                await fc.inventory()
    finally:
        await server.close()
    assert exc.value.status == 401 and exc.value.code == "CredentialsRefused"
    assert f"POST {SESSIONS}" in str(exc.value) and "refused the credentials" in str(exc.value)


def credentials(mode: str, tmp_path: Path) -> Auth:
    (tmp_path / "pw").write_text("s3cret\n")
    password = TokenSource(path=tmp_path / "pw")
    if mode == "session":
        return SessionAuth("admin", password)
    return BasicAuth("admin", password) if mode == "basic" else Auth(TokenSource("token"))


@pytest.mark.parametrize("where", ["GET", "POST"])
@pytest.mark.parametrize("mode", ["bearer", "basic", "session"])
async def test_a_redirect_to_another_origin_is_refused(
    mode: str, where: str, tmp_path: Path
) -> None:
    other = await MockupServer().start()  # another origin: must see no request at all
    uri = f"{EPS}/gpu-0" if where == "GET" else CONNS

    async def away(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(other.url + uri)

    server = Sessions().server()
    server.bodies, server.auth = plain_tree(), None  # each endpoint its own GET
    server.routes[(where, uri)] = away
    await server.start()
    ports = (server.url.rsplit(":", 1)[1], other.url.rsplit(":", 1)[1])
    try:
        async with FabricClient(server.url, credentials(mode, tmp_path)) as fc:
            with pytest.raises(FabricRedirectRefused) as exc:
                if where == "GET":
                    await fc.inventory()
                else:
                    await fc.attach("gpu-0", "node-a", "adapter0")
    finally:
        await server.close()
        await other.close()
    assert other.requests == []
    assert f"fabric {where} {uri}: HTTP 307 redirects from http://127.0.0.1:{ports[0]} to " \
           f"http://127.0.0.1:{ports[1]}, another origin" in str(exc.value)  # fmt: skip


async def test_a_session_expiring_mid_listing_is_renewed_once_and_deleted(tmp_path: Path) -> None:
    sessions = Sessions()
    server = sessions.server()
    server.bodies = plain_tree()  # five endpoint GETs at once

    async def expire_on_listing(request: web.Request) -> web.Response:
        if request.headers.get("X-Auth-Token") not in sessions.valid:
            return web.json_response(error("Base.NoValidSession", "x"), status=401)
        sessions.valid.clear()  # the session expires while the members are fetched
        return web.json_response(server.bodies[EPS])

    server.routes[("GET", EPS)] = expire_on_listing
    await server.start()
    try:
        async with FabricClient(server.url, credentials("session", tmp_path)) as fc:
            sessions.valid.clear()
            inv = await fc.inventory()
    finally:
        await server.close()
    assert len(inv.devices) == 4
    assert sessions.logins == 2 and sessions.logouts == 1 and sessions.valid == set()


async def test_an_oauth2_token_endpoint_redirect_is_not_followed_with_the_secret(
    tmp_path: Path,
) -> None:
    other = await MockupServer().start()
    token_path = "/realms/r/protocol/openid-connect/token"

    async def away(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(other.url + token_path)  # 307: the form again

    server = await MockupServer(bodies=plain_tree(), routes={("POST", token_path): away}).start()
    (tmp_path / "secret").write_text("client-secret\n")
    auth = OAuth2Auth(server.url + token_path, "patchbay", TokenSource(path=tmp_path / "secret"))
    try:
        async with FabricClient(server.url, auth) as fc:
            with pytest.raises(FabricApiError) as exc:
                await fc.inventory()
    finally:
        await server.close()
        await other.close()
    assert other.requests == [] and exc.value.status == 307


async def test_a_connections_collection_that_fails_is_no_fabric_without_attachments() -> None:
    """Unreadable bindings cannot be read as "nothing attached": the read fails,
    naming the collection (and the attach of a device attached there is not asked)."""
    routes = {("GET", CONNS): answering(500)}
    async with serving(MockupServer(bodies=plain_tree(), routes=routes)) as fc:
        with pytest.raises(FabricResourceBroken) as exc:
            await fc.inventory()
    assert exc.value.uri == CONNS and f"GET {CONNS}: HTTP 500" in str(exc.value)
