"""How the fabric client proves who it is, and where it listens for events,
against a real local server: a Redfish session (login, X-Auth-Token, logout on
close, login again after a 401), HTTP Basic, a bearer token from a rotated
file; the settings that choose them; the SSE stream at
``EventService.ServerSentEventUri``, and no stream at all."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from driver.errors import FabricApiError, FabricNotFound
from driver.fabricclient import FabricClient
from driver.fabricclient.auth import BasicAuth, FabricAuthSettings, SessionAuth
from driver.fabricclient.token import TokenSource
from tests.unit.fabric_standard_server import (
    FAB,
    ROOT,
    MockupServer,
    basic,
    contract_tree,
)
from tests.unit.redfish_sessions import SESSIONS, Sessions


def password_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "password"
    path.write_text(text + "\n")
    return path


async def test_session_login_logout_and_login_again_after_401(tmp_path: Path) -> None:
    sessions = Sessions()
    server = await sessions.server().start()
    auth = SessionAuth("admin", TokenSource(path=password_file(tmp_path, "s3cret")))
    try:
        async with FabricClient(server.url, auth) as fc:
            assert len((await fc.inventory()).devices) == 4
            assert sessions.logins == 1  # one session for every request
            sessions.valid.clear()  # the manager restarted: the session is gone
            assert len((await fc.inventory()).devices) == 4
            assert sessions.logins == 2
        assert sessions.logouts == 1 and sessions.valid == set()  # logged out on close
    finally:
        await server.close()
    posts = [h for m, p, h in server.requests if (m, p) == ("POST", SESSIONS)]
    assert all("X-Auth-Token" not in h and "Authorization" not in h for h in posts)


async def test_session_login_refused_names_the_user(tmp_path: Path) -> None:
    server = await Sessions(password="other").server().start()
    auth = SessionAuth("admin", TokenSource(path=password_file(tmp_path, "s3cret")))
    try:
        async with FabricClient(server.url, auth) as fc:
            with pytest.raises(FabricApiError, match="'admin'"):
                await fc.inventory()
    finally:
        await server.close()


async def test_basic_auth_reads_the_rotated_password_file(tmp_path: Path) -> None:
    allowed = {basic("admin", "one")}
    server = MockupServer(
        bodies=contract_tree(), auth=lambda r: r.headers.get("Authorization") in allowed
    )
    await server.start()
    path = password_file(tmp_path, "one")
    try:
        async with FabricClient(server.url, BasicAuth("admin", TokenSource(path=path))) as fc:
            await fc.inventory()
            allowed = {basic("admin", "two")}
            tmp = tmp_path / "new"
            tmp.write_text("two\n")
            tmp.replace(path)  # rotated as the kubelet swaps a Secret
            await fc.inventory()
    finally:
        await server.close()


async def test_bearer_token_from_a_rotated_file(tmp_path: Path) -> None:
    allowed = {"Bearer a"}
    server = MockupServer(
        bodies=contract_tree(), auth=lambda r: r.headers.get("Authorization") in allowed
    )
    await server.start()
    path = password_file(tmp_path, "a")
    try:
        async with FabricClient(server.url, TokenSource(path=path)) as fc:
            await fc.inventory()
            allowed = {"Bearer b"}
            (tmp_path / "new").write_text("b\n")
            (tmp_path / "new").replace(path)
            await fc.inventory()
    finally:
        await server.close()


def test_auth_mode_is_a_setting_with_its_credentials(tmp_path: Path) -> None:
    pw = password_file(tmp_path, "x")
    assert isinstance(
        FabricAuthSettings(fabric_auth="session", fabric_username="u", fabric_password_file=pw)
        .fabric_credentials(), SessionAuth,
    )  # fmt: skip
    with pytest.raises(ValidationError, match="fabric_username and fabric_password_file"):
        FabricAuthSettings(fabric_auth="basic", fabric_token="t")
    with pytest.raises(ValidationError, match="fabric_token or fabric_token_file"):
        FabricAuthSettings()
    with pytest.raises(ValidationError, match="fabric_auth"):
        FabricAuthSettings(fabric_auth="kerberos", fabric_token="t")  # type: ignore[arg-type]


def _events(tree: dict[str, Any], sse: str | None) -> None:
    service: dict[str, Any] = {"@odata.id": f"{ROOT}/EventService"}
    if sse:
        service["ServerSentEventUri"] = sse
    tree[f"{ROOT}/EventService"] = service


async def test_events_follow_the_advertised_sse_uri() -> None:
    tree = contract_tree()
    sse = "/custom/stream"  # not the simulator's path: read from the EventService
    _events(tree, sse)

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        record = {
            "MemberId": "0",
            "MessageId": "ResourceEvent.1.0.ResourceChanged",
            "OriginOfCondition": {"@odata.id": f"{FAB}/Endpoints/gpu-0"},
        }
        event = {"EventId": "1", "Events": [record]}
        await resp.write(f"id: 1\ndata: {json.dumps(event)}\n\n".encode())
        await asyncio.Event().wait()  # held open until the client goes
        return resp

    server = await MockupServer(bodies=tree, routes={("GET", sse): stream}).start()
    try:
        async with FabricClient(server.url, "t") as fc:
            events = fc.events()
            assert await anext(events) == []
            assert await asyncio.wait_for(anext(events), 10) == [f"{FAB}/Endpoints/gpu-0"]
            await events.aclose()
    finally:
        await server.close()


@pytest.mark.parametrize("service", [True, False])
async def test_no_sse_stream_ends_events_so_the_controller_polls(service: bool) -> None:
    tree = contract_tree()
    if service:
        _events(tree, None)
    else:
        tree[ROOT] = {k: v for k, v in tree[ROOT].items() if k != "EventService"}
    server = await MockupServer(bodies=tree).start()
    try:
        async with FabricClient(server.url, "t") as fc:
            with pytest.raises(FabricNotFound, match="ServerSentEventUri"):
                await anext(fc.events())
    finally:
        await server.close()


async def test_the_login_names_the_session_type_the_service_advertises(tmp_path: Path) -> None:
    """Issue 35: every POSTed body carries @odata.type (Sunfish refuses one without),
    at the newest version the service's $metadata (read without credentials) has."""
    sessions, posted = Sessions(), list[dict[str, Any]]()
    server = sessions.server()
    login = server.routes[("POST", SESSIONS)]

    async def recording(request: web.Request) -> web.StreamResponse:
        posted.append(await request.json())
        return await login(request)

    async def metadata(request: web.Request) -> web.Response:
        text = '<Include Namespace="Session.v1_7_0"/><Include Namespace="Session.v1_8_0"/>'
        return web.Response(text=text, content_type="application/xml")

    server.routes |= {("POST", SESSIONS): recording, ("GET", f"{ROOT}/$metadata"): metadata}
    await server.start()
    try:
        auth = SessionAuth("admin", TokenSource(path=password_file(tmp_path, "s3cret")))
        async with FabricClient(server.url, auth) as fc:
            assert len((await fc.inventory()).devices) == 4
    finally:
        await server.close()
    assert [p["@odata.type"] for p in posted] == ["#Session.v1_8_0.Session"]
