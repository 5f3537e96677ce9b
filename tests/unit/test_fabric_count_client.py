"""The ``count`` dialect of the fabric client against the simulator over HTTP, with
OAuth2 client credentials: the manager picks the device, the answer names it by
its serial, a wrong model or nothing arriving fails naming what arrived (and the
wrong device is given back), detach scales down; and its settings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from driver.errors import CountAttachFailed, FabricApiError, FabricNotFound
from driver.fabricclient import FabricClient
from driver.fabricclient.auth import FabricAuthSettings, OAuth2Auth
from driver.fabricclient.dialect_count import (
    CountAttachResult,
    CountDialect,
    FabricCountSettings,
    Machines,
)
from driver.fabricclient.token import TokenSource
from fabric.service import inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.demo import write_demo
from fabric.service.hardware import system_uuid
from fabric.service.store import Store

SECRET = "t0ken"
TENANT = "7d1f0f8c-0000-4000-8000-000000000001"
TOKEN_PATH = "/id_manager/realms/cdi/protocol/openid-connect/token"


class Env:
    def __init__(self, server: TestServer, client: FabricClient) -> None:
        self.server, self.client = server, client

    async def faults(self, body: dict[str, int]) -> None:
        headers = {"Authorization": f"Bearer {SECRET}"}
        url = self.server.make_url("/patchbay/v1/count-faults")
        async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()

    def oauth(self, secret: str = SECRET) -> OAuth2Auth:
        return OAuth2Auth(str(self.server.make_url(TOKEN_PATH)), "patchbay", TokenSource(secret))


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    fab = Fabric(inventory.load(write_demo(tmp_path)), Store(tmp_path / "f.db"), (0.01, 0.01))
    await fab.start()
    server = TestServer(make_app(fab, SECRET))
    await server.start_server()
    machines = Machines({"node-a": system_uuid("node-a")}, key="example.com/machine")
    machines.set_nodes({"node-b": {"example.com/machine": system_uuid("node-b")}})
    url = str(server.make_url(""))
    dialect = CountDialect(machines, TENANT, exact=False)
    oauth = OAuth2Auth(str(server.make_url(TOKEN_PATH)), "patchbay", TokenSource(SECRET))
    client = FabricClient(url, oauth, dialect=dialect)
    yield Env(server, client)
    await client.close()
    await server.close()
    await fab.close()


async def test_the_manager_picks_the_device_and_the_answer_names_it_by_serial(env: Env) -> None:
    inv = await env.client.inventory()  # Redfish reads with the OAuth2 access token
    # Asked for gpu-3's model: the manager takes the first free H200, gpu-2.
    result = await env.client.attach("gpu-3", "node-a", "adapter1", key="claim-1")
    assert isinstance(result, CountAttachResult) and result.task is None
    assert result.arrived is not None and result.arrived.health == "OK"
    assert result.arrived.serial == inv.device("gpu-2").serial
    assert result.arrived.model == inv.device("gpu-3").model
    conn = (await env.client.device("gpu-2")).connection
    assert conn is not None and (conn.node, conn.adapter) == ("node-a", "adapter1")
    # A node whose machine comes from its Node label: node-b.
    other = await env.client.attach("gpu-0", "node-b", "adapter0", key="claim-2")
    assert isinstance(other, CountAttachResult) and other.arrived is not None
    assert other.arrived.serial == inv.device("gpu-0").serial
    assert await env.client.detach("gpu-2") is None
    assert (await env.client.device("gpu-2")).connection is None
    with pytest.raises(FabricNotFound, match="node node-c: no machine id"):
        await env.client.attach("gpu-1", "node-c", "adapter0")


async def test_a_wrong_model_or_nothing_fails_naming_what_arrived(env: Env) -> None:
    inv = await env.client.inventory()
    await env.faults({"wrongModelNext": 1})
    with pytest.raises(CountAttachFailed) as failed:
        await env.client.attach("gpu-2", "node-a", "adapter1", key="claim-1")
    gpu0 = inv.device("gpu-0")
    assert f"gpu {gpu0.model} serial {gpu0.serial}" in str(failed.value)
    assert "arrived instead; scaled it down again" in str(failed.value)
    assert (await env.client.device("gpu-0")).connection is None  # given back
    await env.faults({"nothingNext": 1})
    with pytest.raises(
        CountAttachFailed, match=r"H200-SXM5-141GB for node node-a.*nothing arrived"
    ):
        await env.client.attach("gpu-2", "node-a", "adapter1", key="claim-2")


async def test_oauth2_refused_credentials_name_the_client(env: Env) -> None:
    client = FabricClient(str(env.server.make_url("")), env.oauth("wrong"))
    try:
        with pytest.raises(FabricApiError, match=r"as client 'patchbay'.*invalid_client"):
            await client.inventory()
    finally:
        await client.close()


async def test_exact_gives_back_another_device_of_the_model(env: Env) -> None:
    assert isinstance(env.client.dialect, CountDialect)
    env.client.dialect.exact = True
    inv = await env.client.inventory()
    gpu2 = inv.device("gpu-2")
    with pytest.raises(CountAttachFailed, match=f"chose gpu .* serial {gpu2.serial} .*, not gpu-3"):
        await env.client.attach("gpu-3", "node-a", "adapter1", key="claim-1")
    assert (await env.client.device("gpu-2")).connection is None
    result = await env.client.attach("gpu-2", "node-a", "adapter1", key="claim-2")
    assert isinstance(result, CountAttachResult) and result.arrived is not None
    assert result.arrived.serial == gpu2.serial


def test_count_settings_name_what_is_missing() -> None:
    with pytest.raises(ValidationError, match="fabric_count_tenant"):
        FabricCountSettings(fabric_dialect="count", fabric_machines="a=m1")
    with pytest.raises(ValidationError, match="fabric_machines or fabric_machine_key"):
        FabricCountSettings(fabric_dialect="count", fabric_count_tenant=TENANT)
    with pytest.raises(ValidationError, match="fabric_machines: 'a' is not node=machine"):
        FabricCountSettings(fabric_machines="a")
    ok = FabricCountSettings(
        fabric_dialect="count", fabric_count_tenant=TENANT, fabric_machines="a=m1"
    )
    dialect = ok.dialect()
    assert isinstance(dialect, CountDialect) and dialect.machines.of("a") == "m1"
    assert FabricCountSettings().dialect().name == "connections"
    with pytest.raises(ValidationError, match="fabric_oauth_token_url"):
        FabricAuthSettings(
            fabric_auth="oauth2", fabric_username="c", fabric_password_file=Path("/x")
        )


async def test_asking_again_after_a_wrong_model_is_a_new_request(env: Env) -> None:
    """The simulator replays an answer for a repeated Idempotency-Key: the
    attach after one whose device was given back must not repeat its key."""
    inv = await env.client.inventory()
    await env.faults({"wrongModelNext": 1})
    with pytest.raises(CountAttachFailed, match="arrived instead"):
        await env.client.attach("gpu-2", "node-a", "adapter1", key="claim-1")
    result = await env.client.attach("gpu-2", "node-a", "adapter1", key="claim-1")
    assert isinstance(result, CountAttachResult) and result.arrived is not None
    assert result.arrived.serial == inv.device("gpu-2").serial
