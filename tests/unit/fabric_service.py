"""The in-process fabric service for unit tests: its bearer token, and
:class:`Env`: the service, its test server and a real client, with raw
Redfish requests and fault injection; and a hot-add that breaks half-way.

Why: the fabric API's tests, the half-done-task tests and the controller's
zones and detach-retry tests all drive the same service through the real
client; its setup lives here once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from driver.fabricclient import FabricClient
from fabric.service import hosts
from fabric.service.core import Fabric

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
