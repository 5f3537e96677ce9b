"""The simulator's count face (Fujitsu-FM-shaped) over real HTTP: OAuth2 client
credentials, model-based scale-up that picks the device, its faults, scale-down,
the audit, and that the Redfish face sees what the count face attached."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from driver.fabricclient import FabricClient
from fabric.service import inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.demo import write_demo
from fabric.service.hardware import system_uuid
from fabric.service.store import Store

SECRET = "t0ken"
TENANT = "7d1f0f8c-0000-4000-8000-000000000001"
TOKEN_PATH = "/id_manager/realms/cdi/protocol/openid-connect/token"
H100, H200 = "H100-SXM5-80GB", "H200-SXM5-141GB"
NODE_A = system_uuid("node-a")


class Env:
    def __init__(self, server: TestServer, session: aiohttp.ClientSession) -> None:
        self.server, self.session, self.access = server, session, ""

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token if token is not None else self.access}"}
        headers.update(kw.pop("headers", {}))
        params = kw.pop("params", {"tenant_uuid": TENANT})
        url = self.server.make_url(path)
        async with self.session.request(
            method, url, json=body, headers=headers, params=params, **kw
        ) as r:
            return r.status, await r.json(content_type=None)

    async def login(self, secret: str = SECRET, grant: str = "client_credentials") -> Any:
        form = {"grant_type": grant, "client_id": "patchbay", "client_secret": secret}
        async with self.session.post(self.server.make_url(TOKEN_PATH), data=form) as r:
            return r.status, await r.json()

    async def scale_up(self, model: str, mach: str = NODE_A, **kw: Any) -> tuple[int, Any]:
        spec = {"column": "model", "operator": "eq", "value": model}
        body = {
            "tenants": {
                "tenant_uuid": TENANT,
                "machines": [
                    {
                        "mach_uuid": mach,
                        "resources": [
                            {
                                "res_specs": [
                                    {
                                        "res_type": "gpu",
                                        "res_spec": {"condition": [spec]},
                                        "res_num": 1,
                                    }
                                ]
                            }
                        ],
                    }
                ],
            }
        }
        return await self.call(
            "PATCH", f"/fabric_manager/api/v1/machines/{mach}/update", body, **kw
        )

    async def scale_down(self, res_uuid: str, mach: str = NODE_A) -> tuple[int, Any]:
        spec = {"res_type": "gpu", "res_uuid": res_uuid, "res_num": 1}
        machine = {"mach_uuid": mach, "resources": [{"res_specs": [spec]}]}
        body = {"tenants": {"tenant_uuid": TENANT, "machines": [machine]}}
        return await self.call("DELETE", f"/fabric_manager/api/v1/machines/{mach}/update", body)

    async def audit(self) -> list[dict[str, Any]]:
        _, body = await self.call("GET", "/patchbay/v1/audit", token=SECRET, params={})
        return [e for e in body["attachRequests"] if e["dialect"] == "count"]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    fab = Fabric(inventory.load(write_demo(tmp_path)), Store(tmp_path / "f.db"), (0.01, 0.01))
    await fab.start()
    server = TestServer(make_app(fab, SECRET))
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        e = Env(server, session)
        status, tok = await e.login()
        assert status == 200 and tok["token_type"] == "Bearer", tok
        e.access = tok["access_token"]
        yield e
    await server.close()
    await fab.close()


async def test_token_endpoint_takes_only_client_credentials_and_the_api_only_tokens(
    env: Env,
) -> None:
    status, body = await env.login(secret="wrong")
    assert status == 401 and body["error"] == "invalid_client"
    status, body = await env.login(grant="password")
    assert status == 400 and body["error"] == "unsupported_grant_type"
    status, body = await env.call(
        "GET", f"/fabric_manager/api/v1/machines/{NODE_A}", token="forged"
    )
    assert status == 401 and "access token" in body["detail"]["message"]
    status, body = await env.call("GET", f"/fabric_manager/api/v1/machines/{NODE_A}", params={})
    assert status == 400 and body["detail"]["message"].startswith("tenant_uuid")


async def test_scale_up_picks_a_free_device_of_the_model_and_the_redfish_face_sees_it(
    env: Env,
) -> None:
    status, body = await env.scale_up(H200)
    assert status == 200, body
    (res,) = body["data"]["machines"][0]["resources"]
    assert res["res_name"] == "gpu-2" and res["res_op_status"].startswith("0")
    assert res["res_spec"]["condition"] == [{"column": "model", "operator": "eq", "value": H200}]
    client = FabricClient(str(env.server.make_url("")), SECRET)
    try:
        gpu2 = (await client.inventory()).device("gpu-2")
        assert res["res_serial_num"] == gpu2.serial
        conn = gpu2.connection
        assert conn is not None and (conn.node, conn.adapter, conn.state) == (
            "node-a",
            "adapter1",
            "Attached",
        )
    finally:
        await client.close()
    assert (await env.scale_up(H200))[1]["data"]["machines"][0]["resources"][0][
        "res_name"
    ] == "gpu-3"
    status, body = await env.scale_up(H200)
    assert status == 409 and f"no free gpu of model {H200}" in body["detail"]["message"]
    assert [(e["target"], e["initiator"]) for e in await env.audit()] == [
        ("gpu-2", "node-a/adapter1"), ("gpu-3", "node-a/adapter1"),
    ]  # fmt: skip
    status, body = await env.call("GET", f"/fabric_manager/api/v1/machines/{NODE_A}")
    assert [r["res_name"] for r in body["data"]["machines"][0]["resources"]] == ["gpu-2", "gpu-3"]


async def test_faults_attach_another_model_or_nothing(env: Env) -> None:
    status, _ = await env.call(
        "POST",
        "/patchbay/v1/count-faults",
        {"wrongModelNext": 1, "nothingNext": 1},
        token=SECRET,
        params={},
    )
    assert status == 200
    status, body = await env.scale_up(H200)  # "nothing" is taken first
    assert status == 200 and body["data"]["machines"][0]["resources"] == []
    status, body = await env.scale_up(H200)
    (res,) = body["data"]["machines"][0]["resources"]
    assert res["res_spec"]["condition"][0]["value"] == H100 and res["res_name"] == "gpu-0"
    assert [e["target"] for e in await env.audit()] == ["", "gpu-0"]


async def test_scale_down_detaches_by_res_uuid(env: Env) -> None:
    _, body = await env.scale_up(H100)
    res_uuid = body["data"]["machines"][0]["resources"][0]["res_uuid"]
    status, body = await env.scale_down(res_uuid)
    assert status == 200 and body["data"]["machines"][0]["resources"] == []
    status, body = await env.scale_down(res_uuid)
    assert status == 404 and "is not attached to machine" in body["detail"]["message"]


async def test_a_repeated_idempotency_key_attaches_once(env: Env) -> None:
    first = await env.scale_up(H100, headers={"Idempotency-Key": "claim-1"})
    again = await env.scale_up(H100, headers={"Idempotency-Key": "claim-1"})
    assert first == again and first[0] == 200
    assert len(await env.audit()) == 1


async def test_bad_bodies_name_the_field(env: Env) -> None:
    path = f"/fabric_manager/api/v1/machines/{NODE_A}/update"
    status, body = await env.call(
        "PATCH", path, {"tenants": {"tenant_uuid": TENANT, "machines": []}}
    )
    assert status == 400 and body["detail"]["message"].startswith("tenants.machines")
    status, body = await env.scale_up(H100, mach=system_uuid("nowhere"))
    assert status == 404 and "no such machine" in body["detail"]["message"]
