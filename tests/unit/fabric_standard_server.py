"""A real local Redfish service for the fabric client's tests: DMTF mockups over HTTP.

Why: the client must be shown to read standard bodies and to tolerate the
standard's variations (``$expand`` absent, refused or ignored; every answer
to an operation; sessions, Basic, bearer) over a real socket, not with its
HTTP call replaced. :class:`MockupServer` serves a mockup folder of
``../shared/redfish/mockups`` (each folder mirrors the URI tree below
``/redfish/v1``: ``Fabrics/CXL/index.json`` is GET ``/redfish/v1/Fabrics/CXL``)
plus ``bodies`` a test adds or overrides, records every request, and hands
any other method (or a path in ``routes``) to the test's own handlers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from driver.fabricclient import FabricClient

REPO = Path(__file__).resolve().parents[2]
MOCKUPS = REPO / ".." / "shared" / "redfish" / "mockups"
ROOT = "/redfish/v1"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_mockup(name: str) -> dict[str, dict[str, Any]]:
    """Every resource of mockup ``name``, by URI."""
    base = MOCKUPS / name
    out = {}
    for index in base.rglob("index.json"):
        rel = index.parent.relative_to(base).as_posix()
        uri = ROOT if rel == "." else f"{ROOT}/{rel}"
        out[uri] = json.loads(index.read_text())
    return out


class MockupServer:
    """``mockup``: the folder name ("" for none); ``expand``: how ``$expand`` is
    answered: "honour" (members inlined), "ignore" (bare links anyway) or
    "refuse" (400); ``auth``: None (open) or the headers' check."""

    def __init__(
        self,
        mockup: str = "",
        *,
        bodies: dict[str, dict[str, Any]] | None = None,
        routes: Mapping[tuple[str, str], Handler] | None = None,
        expand: str = "honour",
        auth: Callable[[web.Request], bool] | None = None,
    ) -> None:
        self.bodies = load_mockup(mockup) if mockup else {}
        self.bodies.update(bodies or {})
        self.routes = dict(routes or {})
        self.expand = expand
        self.auth = auth
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # method, path+query, headers
        self.server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def paths(self, method: str = "GET") -> list[str]:
        return [p for m, p, _ in self.requests if m == method]

    async def start(self) -> MockupServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.server = TestServer(app)
        await self.server.start_server()
        return self

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        route = self.routes.get((request.method, path))
        if route is None and self.auth is not None and not self.auth(request):
            return web.json_response(error("Base.NoValidSession", "no credentials"), status=401)
        if route is not None:
            return await route(request)
        if request.method != "GET" or path not in self.bodies:
            return web.json_response(error("Base.ResourceNotFound", path), status=404)
        body = self.bodies[path]
        if "$expand" in request.query and "Members" in body:
            if self.expand == "refuse":
                return web.json_response(error("Base.QueryNotSupported", "$expand"), status=400)
            if self.expand == "honour":
                members = [self.bodies.get(m["@odata.id"].rstrip("/"), m) for m in body["Members"]]
                body = {**body, "Members": members}
        return web.json_response(body)


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _l(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def _coll(uri: str, members: list[str]) -> dict[str, Any]:
    return {"@odata.id": uri, "Members": [_l(m) for m in members]}


FAB = f"{ROOT}/Fabrics/pcie"
CH = f"{ROOT}/Chassis/box"
GPU_UUID = "3B3E7A52-5B0E-4C2B-8E64-0C5C9A3D1F00"
NIC_MAC = "02:00:00:AA:BB:01"


def contract_tree(node: str = "node-a", adapter: str = "adapter0") -> dict[str, dict[str, Any]]:
    """A one-switch fabric as the session's wire contract shapes it: a host adapter
    and a GPU, a NIC, an NVMe drive and a CXL memory device, all standard."""
    sw_port, sys_uri = f"{FAB}/Switches/sw0/Ports", f"{ROOT}/Systems/{node}"
    ad_port = f"{sys_uri}/FabricAdapters/{adapter}/Ports/0"
    t: dict[str, dict[str, Any]] = {
        ROOT: {
            "@odata.id": ROOT,
            "Fabrics": _l(f"{ROOT}/Fabrics"),
            "EventService": _l(f"{ROOT}/EventService"),
            "ProtocolFeaturesSupported": {"ExpandQuery": {"NoLinks": True}},
        },
        f"{ROOT}/Fabrics": _coll(f"{ROOT}/Fabrics", [FAB]),
        FAB: {
            "@odata.id": FAB,
            "Id": "pcie",
            "Endpoints": _l(f"{FAB}/Endpoints"),
            "Connections": _l(f"{FAB}/Connections"),
            "Zones": _l(f"{FAB}/Zones"),
        },
        f"{FAB}/Connections": _coll(f"{FAB}/Connections", []),
        f"{FAB}/Zones": _coll(f"{FAB}/Zones", [f"{FAB}/Zones/z-ini"]),
        f"{FAB}/Zones/z-ini": {
            "@odata.id": f"{FAB}/Zones/z-ini",
            "Id": "z-ini",
            "@odata.etag": 'W/"1"',
            "ZoneType": "ZoneOfEndpoints",
            "Links": {"Endpoints": [_l(f"{FAB}/Endpoints/ini")]},
        },
        sys_uri: {
            "@odata.id": sys_uri,
            "Id": node,
            "HostName": node,
            "UUID": "0E2A5F4C-1111-5222-8333-444455556666",
        },
        f"{FAB}/Endpoints/ini": {
            "@odata.id": f"{FAB}/Endpoints/ini",
            "Id": "ini",
            "ConnectedEntities": [
                {"EntityType": "RootComplex", "EntityRole": "Initiator", "EntityLink": _l(sys_uri)}
            ],
            "Links": {
                "LocalPorts": [_l(ad_port)],
                "ConnectedPorts": [_l(f"{sw_port}/up0")],
                "Zones": [_l(f"{FAB}/Zones/z-ini")],
            },
        },
    }
    devices = {
        "gpu-0": ("Processor", f"{CH}/Processors/gpu-0", "0x030200", "0x10de", "0x2335"),
        "nic-0": (
            "NetworkController",
            f"{CH}/NetworkAdapters/nic-0",
            "0x020000",
            "0x15b3",
            "0x1021",
        ),
        "nvme-0": ("Drive", f"{CH}/Drives/nvme-0", "0x010802", "0x144d", "0xa80a"),
        "cxl-0": (
            "CXLDevice",
            f"{CH}/PCIeDevices/cxl-0/CXLLogicalDevices/0",
            "0x050210",
            "0x144d",
            "0x0c00",
        ),
    }
    for dev, (etype, link, cls, ven, did) in devices.items():
        fn = f"{CH}/PCIeDevices/{dev}/PCIeFunctions/0"
        t[f"{FAB}/Endpoints/{dev}"] = {
            "@odata.id": f"{FAB}/Endpoints/{dev}",
            "Id": dev,
            "Status": {"Health": None},
            "ConnectedEntities": [
                {"EntityType": etype, "EntityRole": "Target", "EntityLink": _l(link)}
            ],
            "Links": {"ConnectedPorts": [_l(f"{sw_port}/dn-{dev}")]},
        }
        t[f"{CH}/PCIeDevices/{dev}"] = {
            "@odata.id": f"{CH}/PCIeDevices/{dev}",
            "Model": f"{dev} model",
            "SerialNumber": f"SN-{dev}",
            "PCIeFunctions": _l(f"{CH}/PCIeDevices/{dev}/PCIeFunctions"),
        }
        t[f"{CH}/PCIeDevices/{dev}/PCIeFunctions"] = _coll(
            f"{CH}/PCIeDevices/{dev}/PCIeFunctions", [fn]
        )
        t[fn] = {
            "@odata.id": fn,
            "ClassCode": cls,
            "VendorId": ven,
            "DeviceId": did,
            "Links": {"PCIeDevice": _l(f"{CH}/PCIeDevices/{dev}")},
        }
    fn0 = [_l(f"{CH}/PCIeDevices/{d}/PCIeFunctions/0") for d in devices]
    ndf = f"{CH}/NetworkAdapters/nic-0/NetworkDeviceFunctions"
    chunk = f"{CH}/MemoryDomains/cxl-0/MemoryChunks/0"
    t |= {
        devices["gpu-0"][1]: {
            "@odata.id": devices["gpu-0"][1],
            "ProcessorType": "GPU",
            "UUID": GPU_UUID,
            "Model": "H200",
            "SerialNumber": "G1",
            "Links": {"PCIeFunctions": [fn0[0]]},
        },
        devices["nic-0"][1]: {
            "@odata.id": devices["nic-0"][1],
            "Model": "CX7",
            "SerialNumber": "N1",
            "NetworkDeviceFunctions": _l(ndf),
        },
        ndf: _coll(ndf, [f"{ndf}/0"]),
        f"{ndf}/0": {
            "@odata.id": f"{ndf}/0",
            "Ethernet": {"PermanentMACAddress": NIC_MAC},
            "Links": {"PCIeFunction": fn0[1]},
        },
        devices["nvme-0"][1]: {
            "@odata.id": devices["nvme-0"][1],
            "Protocol": "NVMe",
            "SerialNumber": "S3X1",
            "Model": "PM1743",
            "CapacityBytes": 3840 << 30,
            "Links": {"PCIeFunctions": [fn0[2]]},
            "Identifiers": [{"DurableNameFormat": "NQN", "DurableName": "nqn.2014-08.dev:nvme-0"}],
        },
        devices["cxl-0"][1]: {
            "@odata.id": devices["cxl-0"][1],
            "MemorySizeMiB": 65536,
            "Identifiers": [
                {"DurableNameFormat": "GCXLID", "DurableName": "4C-1D-96-FF-FE-DD-D8-35:0000"}
            ],
            "Links": {"PCIeFunctions": [fn0[3]], "MemoryChunks": [_l(chunk)]},
        },
    }
    t[f"{FAB}/Endpoints"] = _coll(
        f"{FAB}/Endpoints", [u for u in t if u.startswith(f"{FAB}/Endpoints/")]
    )
    return t


@asynccontextmanager
async def serving(server: MockupServer, **kw: Any) -> AsyncIterator[FabricClient]:
    """A client of ``server`` (started here, closed after), built with ``kw``."""
    await server.start()
    try:
        async with FabricClient(server.url, "token", **kw) as fc:
            yield fc
    finally:
        await server.close()
