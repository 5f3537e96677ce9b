"""The in-process fabric service for unit tests: its bearer token, and
:class:`Env`: the service, its test server and a real client, with raw
Redfish requests and fault injection; and a hot-add that breaks half-way.

Why: the fabric API's tests, the half-done-task tests and the controller's
zones and detach-retry tests all drive the same service through the real
client; its setup (:func:`serving`, :func:`fabric_env`) lives here once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from driver.fabricclient import FabricClient
from driver.fabricclient.dialect import DialectName
from fabric.service import hosts, inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.demo import write_demo
from fabric.service.store import Store

TOKEN = "t0ken"


class Env:
    def __init__(self, fab: Fabric, server: TestServer, client: FabricClient, root: Path):
        self.fab, self.server, self.client, self.root = fab, server, client, root

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def raw(self, method: str, path: str, token: str | None = TOKEN, **kw: object):  # type: ignore[no-untyped-def]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as s,
            s.request(
                method,
                self.url(path),
                headers=headers,
                **kw,  # type: ignore[arg-type]
            ) as r,
        ):
            return r.status, await r.json(content_type=None)

    async def faults(self, body: dict[str, object]) -> dict[str, object]:
        status, data = await self.raw("POST", "/patchbay/v1/faults", json=body)
        assert status == 200, data
        return data  # type: ignore[no-any-return]


@asynccontextmanager
async def serving(
    root: Path, latency: tuple[float, float] = (0.02, 0.02)
) -> AsyncIterator[tuple[Fabric, TestServer]]:
    """The demo fabric (its files under ``root``; attach and detach take
    ``latency``) served on a test server, both closed after."""
    fab = Fabric(inventory.load(write_demo(root)), Store(root / "f.db"), latency)
    await fab.start()
    server = TestServer(make_app(fab, TOKEN))
    await server.start_server()
    try:
        yield fab, server
    finally:
        await server.close()
        await fab.close()


@asynccontextmanager
async def fabric_env(
    root: Path, dialect: DialectName = "connections", latency: tuple[float, float] = (0.02, 0.02)
) -> AsyncIterator[Env]:
    """:func:`serving`, with a real client of ``dialect`` in an :class:`Env`."""
    async with (
        serving(root, latency) as (fab, server),
        FabricClient(str(server.make_url("")), TOKEN, dialect=dialect) as client,
    ):
        yield Env(fab, server, client, root)


def once(real: Callable[..., Any], then: Callable[..., Any]) -> Callable[..., Any]:
    """``then`` on the first call, ``real`` after."""
    calls = 0

    def call(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return then(*args) if calls == 1 else real(*args)

    return call


def break_the_next_attach(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next hot-add puts the device on the host and then fails; the
    hot-remove that undoes it fails too (once: the host works again after)."""
    add, remove = hosts.add, hosts.remove

    def add_then_fail(*args: Any) -> Any:
        add(*args)
        raise FileNotFoundError(2, "No such file or directory", "0000:87:00.4/vendor")

    def refuse(*args: Any) -> Any:
        raise FileNotFoundError(2, "No such file or directory", "0000:87:00.4/remove")

    monkeypatch.setattr(hosts, "add", once(add, add_then_fail))
    monkeypatch.setattr(hosts, "remove", once(remove, refuse))
