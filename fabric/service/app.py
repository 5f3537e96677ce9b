"""The HTTP surface: aiohttp routes from Redfish URIs to the fabric's behaviour.

Handlers are thin: check that the path names something in the inventory,
fetch rows through the worker thread (``Fabric.call``), render with
``redfish.py``. Collections accept ``$expand=.`` to inline their members
(advertised in ``ProtocolFeaturesSupported``). Attach (``POST
.../Connections``) and detach (``DELETE .../Connections/<n>``) answer
``202 Accepted`` with ``Location`` = the task monitor and the Task as body;
re-attaching what is already attached to the same initiator answers ``200``
with the connection. This module holds the fabric resources and builds the
application; the zone dialect is ``zones.py``, the service-level resources
(root, sessions, tasks, events, hardware, admin) ``services.py``.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from driver.fabricclient.token import TokenSource
from fabric.service import (
    accounts,
    bodies,
    count_api,
    faults,
    hardware,
    redfish,
    services,
    uris,
    vcs,
    zones,
)
from fabric.service.answers import (
    FABRIC,
    ONCE,
    SESSIONS,
    STATIC,
    TOKEN,
    ZONE_LOCK,
    Json,
    answer,
    expand,
    fabric_of,
)
from fabric.service.auth import auth_middleware, error_middleware
from fabric.service.core import Fabric
from fabric.service.errors import RedfishError, not_found
from fabric.service.idempotency import Idempotency
from fabric.service.inventory import Initiator
from fabric.service.protocol import protocol_middleware
from fabric.service.sessions import Sessions
from fabric.service.store import Connection, DeviceState


async def fabrics(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    members = [redfish.fabric(fab.inv, f) for f in sorted(fab.inv.fabrics)]
    return answer(redfish.collection(request.path, "Fabric", members, expand(request)))


async def fabric(request: web.Request) -> web.Response:
    fab, ident = fabric_of(request)
    return answer(redfish.fabric(fab.inv, ident))


async def switches(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    ids = [k.split("/", 1)[1] for k in fab.inv.switches if k.startswith(f + "/")]
    members = [redfish.switch(fab.inv, f, s) for s in ids]
    return answer(redfish.collection(request.path, "Switch", members, expand(request)))


def _switch(request: web.Request) -> tuple[Fabric, str, str]:
    fab, f = fabric_of(request)
    sw = request.match_info["switch"]
    if f"{f}/{sw}" not in fab.inv.switches:
        raise not_found(request.path)
    return fab, f, sw


async def switch(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    return answer(redfish.switch(fab.inv, f, sw))


async def ports(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    members = [redfish.port(fab.inv, f, sw, p) for p in fab.inv.switches[f"{f}/{sw}"]]
    return answer(redfish.collection(request.path, "Port", members, expand(request)))


async def port(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    if request.match_info["port"] not in fab.inv.switches[f"{f}/{sw}"]:
        raise not_found(request.path)
    return answer(redfish.port(fab.inv, f, sw, request.match_info["port"]))


def _vcs(request: web.Request) -> tuple[Fabric, Initiator]:
    fab, f, sw = _switch(request)
    ini = {i.port: i for i in vcs.vcs_initiators(fab.inv, f, sw)}.get(request.match_info["vcs"])
    if ini is None:
        raise not_found(request.path)
    return fab, ini


async def vcss(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    members = [vcs.vcs(i) for i in vcs.vcs_initiators(fab.inv, f, sw)]
    return answer(redfish.collection(request.path, "VirtualCXLSwitch", members, expand(request)))


async def virtual_switch(request: web.Request) -> web.Response:
    return answer(vcs.vcs(_vcs(request)[1]))


async def vppbs(request: web.Request) -> web.Response:
    fab, ini = _vcs(request)
    conns = await fab.call(fab.store.connections)
    members = [vcs.vppb(fab.inv, ini, n, conns) for n in vcs.vppb_ids(ini)]
    kind = "VirtualPCI2PCIBridge"
    return answer(redfish.collection(request.path, kind, members, expand(request)))


async def vppb(request: web.Request) -> web.Response:
    fab, ini = _vcs(request)
    if request.match_info["vppb"] not in vcs.vppb_ids(ini):
        raise not_found(request.path)
    conns = await fab.call(fab.store.connections)
    return answer(vcs.vppb(fab.inv, ini, request.match_info["vppb"], conns))


def _snapshot(fab: Fabric) -> tuple[dict[str, DeviceState], dict[str, Connection]]:
    devices = {d: fab.store.device(d) for d in fab.inv.targets}
    conns = {c.device: c for c in fab.store.connections()}
    return devices, conns


async def _endpoint_json(request: web.Request, fab: Fabric, ids: list[str]) -> list[Json]:
    devices, conns = await fab.call(_snapshot, fab)
    out = []
    for e in ids:
        if e in fab.inv.initiators:
            out.append(redfish.initiator(fab.inv, fab.inv.initiators[e]))
        else:
            t = fab.inv.targets[e]
            out.append(redfish.target(fab.inv, t, devices[e], conns.get(e)))
    return out


async def endpoints(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    ids = fab.inv.endpoints(f)
    members = await _endpoint_json(request, fab, ids)
    body = redfish.collection(request.path, "Endpoint", members, expand(request))
    broken = await fab.call(faults.broken_endpoints, fab.store, ids)
    if broken and expand(request):  # a broken one as a link: its reader meets the 500
        body["Members"] = [
            uris.link(m["@odata.id"]) if m["Id"] in broken else m for m in body["Members"]
        ]
    return answer(body)


async def endpoint(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    ident = request.match_info["endpoint"]
    if ident not in fab.inv.endpoints(f):
        raise not_found(request.path)
    if await fab.call(faults.endpoint_broken, fab.store, ident):
        raise RedfishError(500, "InternalError", f"endpoint {ident}: unreadable (fault "
                           "brokenEndpoint)")  # fmt: skip
    return answer((await _endpoint_json(request, fab, [ident]))[0])


async def connections(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    _, conns = await fab.call(_snapshot, fab)
    members = [
        redfish.connection(fab.inv, c)
        for c in sorted(conns.values(), key=lambda c: c.id)
        if fab.inv.targets[c.device].fabric == f
    ]
    return answer(redfish.collection(request.path, "Connection", members, expand(request)))


def _endpoint_ref(fab: Fabric, f: str, uri: str, field: str, role: str) -> str:
    prefix = uris.endpoint_uri(f, "")
    ident = uri.rstrip("/")[len(prefix) :] if uri.startswith(prefix) else ""
    known = fab.inv.initiators if role == "Initiator" else fab.inv.targets
    if ident not in known or known[ident].fabric != f:
        raise RedfishError(
            400, "ResourceMissingAtURI", f"{field}: no {role} endpoint at {uri}", f"#/{field}"
        )
    return ident


async def create_connection(request: web.Request) -> web.Response:
    return await request.app[ONCE].once(request, lambda: _create_connection(request))


async def _create_connection(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    body = bodies.parse(bodies.ConnectionCreate, await request.read())
    ini = _endpoint_ref(
        fab, f, body.links.initiators[0].odata_id,
        "Links.InitiatorEndpoints[0].@odata.id", "Initiator",
    )  # fmt: skip
    tgt = _endpoint_ref(
        fab, f, body.links.targets[0].odata_id, "Links.TargetEndpoints[0].@odata.id", "Target"
    )
    await fab.call(fab.record_attach_request, ini, tgt, "connections")
    out = await fab.attach(ini, tgt)
    conn_json = redfish.connection(fab.inv, out.connection)
    if out.task is None:
        return answer(conn_json, 200, uris.connection_uri(f, out.connection.id))
    return answer(redfish.task(out.task), 202, uris.monitor_uri(out.task.id))


def _conn_id(request: web.Request) -> int:
    raw = request.match_info["connection"]
    if not raw.isdigit():
        raise not_found(request.path)
    return int(raw)


async def connection(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    ident = _conn_id(request)
    conn = await fab.call(fab.store.connection, ident)
    if conn is None or fab.inv.targets[conn.device].fabric != f:
        raise not_found(request.path)
    return answer(redfish.connection(fab.inv, conn))


async def delete_connection(request: web.Request) -> web.Response:
    fab, _ = fabric_of(request)
    task = await fab.detach(_conn_id(request), request.path)
    return answer(redfish.task(task), 202, uris.monitor_uri(task.id))


def make_app(fab: Fabric, token: str | TokenSource) -> web.Application:
    """The service: the Redfish tree, the test-only knobs and the audit."""
    source = TokenSource(token) if isinstance(token, str) else token
    live = Sessions()
    middlewares = [error_middleware, protocol_middleware(), auth_middleware(source, live)]
    app = web.Application(middlewares=middlewares)
    app[FABRIC] = fab
    app[ONCE] = Idempotency(fab.store, fab.call)
    app[SESSIONS] = live
    app[TOKEN] = source
    app[STATIC] = {**hardware.tree(fab.inv), **accounts.tree()}
    app[ZONE_LOCK] = asyncio.Lock()

    async def end_streams(_: web.Application) -> None:
        fab.events.close()

    app.on_shutdown.append(end_streams)
    r, F = app.router, f"{uris.FABRICS}/{{fabric}}"
    r.add_get(uris.FABRICS, fabrics)
    r.add_get(F, fabric)
    r.add_get(f"{F}/Switches", switches)
    r.add_get(f"{F}/Switches/{{switch}}", switch)
    r.add_get(f"{F}/Switches/{{switch}}/Ports", ports)
    r.add_get(f"{F}/Switches/{{switch}}/Ports/{{port}}", port)
    r.add_get(f"{F}/Switches/{{switch}}/VCSs", vcss)
    r.add_get(f"{F}/Switches/{{switch}}/VCSs/{{vcs}}", virtual_switch)
    r.add_get(f"{F}/Switches/{{switch}}/VCSs/{{vcs}}/VPPBs", vppbs)
    r.add_get(f"{F}/Switches/{{switch}}/VCSs/{{vcs}}/VPPBs/{{vppb}}", vppb)
    r.add_get(f"{F}/Endpoints", endpoints)
    r.add_get(f"{F}/Endpoints/{{endpoint}}", endpoint)
    r.add_get(f"{F}/Connections", connections)
    r.add_post(f"{F}/Connections", create_connection)
    r.add_get(f"{F}/Connections/{{connection}}", connection)
    r.add_delete(f"{F}/Connections/{{connection}}", delete_connection)
    zones.add_routes(app, F)
    services.add_routes(app)
    count_api.add_routes(app, source)  # the count face (count_*.py)
    return app
