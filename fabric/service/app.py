"""The HTTP surface: aiohttp routes from Redfish URIs to the fabric's behaviour.

Handlers are thin: check that the path names something in the inventory,
fetch rows through the worker thread (``Fabric.call``), render with
``redfish.py``. Collections accept ``$expand=.`` to inline their members
(the client uses it: one request per collection). Attach and detach answer
``202 Accepted`` with ``Location`` = the task monitor; re-attaching what is
already attached to the same initiator answers ``200`` with the connection.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from driver.fabricclient.token import TokenSource
from fabric.service import bodies, events, faults, redfish
from fabric.service.auth import auth_middleware, error_middleware
from fabric.service.core import Fabric
from fabric.service.errors import RedfishError, not_found
from fabric.service.idempotency import Idempotency
from fabric.service.store import Connection, DeviceState, Task

FABRIC = web.AppKey("fabric", Fabric)
ONCE = web.AppKey("idempotency", Idempotency)
Json = dict[str, Any]


def _fab(request: web.Request) -> tuple[Fabric, str]:
    fab = request.app[FABRIC]
    ident = request.match_info.get("fabric", "")
    if ident not in fab.inv.fabrics:
        raise not_found(request.path)
    return fab, ident


def _expand(request: web.Request) -> bool:
    return request.query.get("$expand", "").startswith((".", "*"))


def _json(body: Json, status: int = 200, location: str | None = None) -> web.Response:
    headers = {"OData-Version": "4.0"}
    if location:
        headers["Location"] = location
    return web.json_response(body, status=status, headers=headers)


async def root(request: web.Request) -> web.Response:
    return _json(redfish.service_root())


async def fabrics(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    members = [redfish.fabric(fab.inv, f) for f in sorted(fab.inv.fabrics)]
    return _json(redfish.collection(request.path, "Fabric", members, _expand(request)))


async def fabric(request: web.Request) -> web.Response:
    fab, ident = _fab(request)
    return _json(redfish.fabric(fab.inv, ident))


async def switches(request: web.Request) -> web.Response:
    fab, f = _fab(request)
    ids = [k.split("/", 1)[1] for k in fab.inv.switches if k.startswith(f + "/")]
    members = [redfish.switch(fab.inv, f, s) for s in ids]
    return _json(redfish.collection(request.path, "Switch", members, _expand(request)))


def _switch(request: web.Request) -> tuple[Fabric, str, str]:
    fab, f = _fab(request)
    sw = request.match_info["switch"]
    if f"{f}/{sw}" not in fab.inv.switches:
        raise not_found(request.path)
    return fab, f, sw


async def switch(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    return _json(redfish.switch(fab.inv, f, sw))


async def ports(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    members = [redfish.port(fab.inv, f, sw, p) for p in fab.inv.switches[f"{f}/{sw}"]]
    return _json(redfish.collection(request.path, "Port", members, _expand(request)))


async def port(request: web.Request) -> web.Response:
    fab, f, sw = _switch(request)
    if request.match_info["port"] not in fab.inv.switches[f"{f}/{sw}"]:
        raise not_found(request.path)
    return _json(redfish.port(fab.inv, f, sw, request.match_info["port"]))


def _snapshot(fab: Fabric) -> tuple[dict[str, DeviceState], dict[str, Connection], list[Task]]:
    devices = {d: fab.store.device(d) for d in fab.inv.targets}
    conns = {c.device: c for c in fab.store.connections()}
    return devices, conns, fab.store.open_tasks()


async def _endpoint_json(fab: Fabric, f: str, ids: list[str]) -> list[Json]:
    devices, conns, _ = await fab.call(_snapshot, fab)
    out = []
    for e in ids:
        if e in fab.inv.initiators:
            out.append(redfish.initiator(fab.inv, fab.inv.initiators[e]))
        else:
            t = fab.inv.targets[e]
            out.append(redfish.target(fab.inv, t, devices[e], conns.get(e)))
    return out


async def endpoints(request: web.Request) -> web.Response:
    fab, f = _fab(request)
    members = await _endpoint_json(fab, f, fab.inv.endpoints(f))
    return _json(redfish.collection(request.path, "Endpoint", members, _expand(request)))


async def endpoint(request: web.Request) -> web.Response:
    fab, f = _fab(request)
    ident = request.match_info["endpoint"]
    if ident not in fab.inv.endpoints(f):
        raise not_found(request.path)
    return _json((await _endpoint_json(fab, f, [ident]))[0])


async def connections(request: web.Request) -> web.Response:
    fab, f = _fab(request)
    _, conns, open_tasks = await fab.call(_snapshot, fab)
    tasks = {t.connection: t for t in open_tasks}
    members = [
        redfish.connection(fab.inv, c, tasks.get(c.id))
        for c in sorted(conns.values(), key=lambda c: c.id)
        if fab.inv.targets[c.device].fabric == f
    ]
    return _json(redfish.collection(request.path, "Connection", members, _expand(request)))


def _endpoint_ref(fab: Fabric, f: str, uri: str, field: str, role: str) -> str:
    prefix = redfish.endpoint_uri(f, "")
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
    fab, f = _fab(request)
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
    conn_json = redfish.connection(fab.inv, out.connection, out.task)
    if out.task is None:
        return _json(conn_json, 200, redfish.connection_uri(f, out.connection.id))
    task_json = redfish.task(fab.inv, out.task)
    return _json(task_json, 202, redfish.task_uri(out.task.id))


def _conn_id(request: web.Request) -> int:
    raw = request.match_info["connection"]
    if not raw.isdigit():
        raise not_found(request.path)
    return int(raw)


async def connection(request: web.Request) -> web.Response:
    fab, f = _fab(request)
    ident = _conn_id(request)
    conn = await fab.call(fab.store.connection, ident)
    if conn is None or fab.inv.targets[conn.device].fabric != f:
        raise not_found(request.path)
    task = await fab.call(fab.store.open_task_of, ident)
    return _json(redfish.connection(fab.inv, conn, task))


async def delete_connection(request: web.Request) -> web.Response:
    fab, _ = _fab(request)
    task = await fab.detach(_conn_id(request), request.path)
    return _json(redfish.task(fab.inv, task), 202, redfish.task_uri(task.id))


async def task_service(request: web.Request) -> web.Response:
    return _json(
        {
            "@odata.id": request.path,
            "@odata.type": "#TaskService.v1_2_0.TaskService",
            "Id": "TaskService",
            "Name": "Tasks",
            "ServiceEnabled": True,
            "Tasks": redfish.link(redfish.TASKS),
        }
    )


async def tasks(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    members = [redfish.task(fab.inv, t) for t in await fab.call(fab.store.tasks)]
    return _json(redfish.collection(request.path, "Task", members, _expand(request)))


async def task(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    raw = request.match_info["task"]
    t = await fab.call(fab.store.task, int(raw)) if raw.isdigit() else None
    if t is None:
        raise not_found(request.path)
    return _json(redfish.task(fab.inv, t))


async def get_faults(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    return _json(await fab.call(faults.view, fab.store, fab.inv, fab.default_latency))


async def post_faults(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    upd = bodies.parse(bodies.FaultsUpdate, await request.read())
    await fab.call(faults.apply, fab.store, fab.inv, upd)
    fab.knobs_changed()
    fab.devices_changed(sorted(upd.devices))
    return await get_faults(request)


async def event_service(request: web.Request) -> web.Response:
    return _json(events.event_service())


async def event_stream(request: web.Request) -> web.StreamResponse:
    return await events.stream(request, request.app[FABRIC].events)


async def audit(request: web.Request) -> web.Response:
    """Test-only: every attach request received (outside /redfish: no validator sees it)."""
    fab = request.app[FABRIC]
    rows = await fab.call(fab.store.attach_requests)
    entries = [
        {"target": r.target, "initiator": r.initiator, "dialect": r.dialect, "at": r.at}
        for r in rows
    ]
    return web.json_response({"attachRequests": entries})


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(fab: Fabric, token: str | TokenSource) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware(token)])
    app[FABRIC] = fab
    app[ONCE] = Idempotency(fab.store, fab.call)

    async def end_streams(_: web.Application) -> None:
        fab.events.close()

    app.on_shutdown.append(end_streams)
    r, F = app.router, "/redfish/v1/Fabrics/{fabric}"
    r.add_get("/redfish/v1", root)
    r.add_get("/redfish/v1/", root)
    r.add_get("/redfish/v1/Fabrics", fabrics)
    r.add_get(F, fabric)
    r.add_get(f"{F}/Switches", switches)
    r.add_get(f"{F}/Switches/{{switch}}", switch)
    r.add_get(f"{F}/Switches/{{switch}}/Ports", ports)
    r.add_get(f"{F}/Switches/{{switch}}/Ports/{{port}}", port)
    r.add_get(f"{F}/Endpoints", endpoints)
    r.add_get(f"{F}/Endpoints/{{endpoint}}", endpoint)
    r.add_get(f"{F}/Connections", connections)
    r.add_post(f"{F}/Connections", create_connection)
    r.add_get(f"{F}/Connections/{{connection}}", connection)
    r.add_delete(f"{F}/Connections/{{connection}}", delete_connection)
    r.add_get("/redfish/v1/TaskService", task_service)
    r.add_get(redfish.TASKS, tasks)
    r.add_get(f"{redfish.TASKS}/{{task}}", task)
    r.add_get("/redfish/v1/EventService", event_service)
    r.add_get(events.SSE_URI, event_stream)
    r.add_get("/patchbay/v1/faults", get_faults)
    r.add_post("/patchbay/v1/faults", post_faults)
    r.add_get("/patchbay/v1/audit", audit)
    r.add_get("/healthz", healthz)
    return app
