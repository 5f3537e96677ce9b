"""The service-level routes: documents, sessions, tasks and their monitors, events, admin.

Why: beside the fabric's own resources (``app.py``, ``zones.py``) a Redfish
service offers its root and OData documents, a SessionService for login,
a TaskService with task monitors for the operations it accepts (202), an
EventService, and the hosts and chassis behind the fabric (``hardware.py``,
and the AccountService (``accounts.py``), answered from the map rendered at
start). ``/patchbay/v1/faults`` and
``/patchbay/v1/audit`` are test-only, outside ``/redfish``.

Task monitor (DSP0266 13.2): ``GET TaskMonitors/<n>`` answers 202 with the
Task while the operation runs; once it ended, the operation's own answer:
an attach ``201`` with the Connection (``Location`` = the connection), a
detach ``204``, a failure ``500`` with ``OperationFailed`` and the task's
message. That stays for :data:`MONITOR_KEEP_S` after the end, then 404.
"""

from __future__ import annotations

import hashlib
import json
import time

from aiohttp import web

from fabric.service import accounts, bodies, events, faults, odata, redfish, sessions, uris
from fabric.service.answers import FABRIC, SESSIONS, STATIC, TOKEN, answer, expand
from fabric.service.auth import same_secret
from fabric.service.core import Fabric
from fabric.service.errors import RedfishError, not_found
from fabric.service.store import Task

MONITOR_KEEP_S = 600.0


def etag(body: dict[str, object]) -> str:
    """A weak ETag of a body: the same body, the same tag."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return f'W/"{digest[:16]}"'


async def version(request: web.Request) -> web.Response:
    return answer({"v1": f"{uris.ROOT}/"})


async def root(request: web.Request) -> web.Response:
    return answer(redfish.service_root())


async def odata_document(request: web.Request) -> web.Response:
    return answer(odata.service_document(redfish.service_root()))


async def metadata(request: web.Request) -> web.Response:
    types = odata.types_in(list(request.app[STATIC].values()))
    types |= odata.types_in([redfish.service_root(), sessions.service(), events.event_service()])
    types |= odata.types_in(redfish.samples(request.app[FABRIC].inv))
    return web.Response(
        text=odata.metadata(types), content_type="application/xml", headers={"OData-Version": "4.0"}
    )


async def static(request: web.Request) -> web.Response:
    """Systems, Chassis, the AccountService and everything under them, from the map."""
    tree = request.app[STATIC]
    body = tree.get(request.path.rstrip("/"))
    if body is None:
        raise not_found(request.path)
    if expand(request) and "Members" in body:
        body = {**body, "Members": [tree[m["@odata.id"]] for m in body["Members"]]}
    return answer(body, headers={"ETag": etag(body)})


# ---- sessions ------------------------------------------------------------------------


async def session_service(request: web.Request) -> web.Response:
    return answer(sessions.service())


async def session_list(request: web.Request) -> web.Response:
    live = request.app[SESSIONS]
    members = [sessions.body(s) for i in live.ids() if (s := live.get(i)) is not None]
    return answer(redfish.collection(uris.SESSIONS, "Session", members, expand(request)))


async def login(request: web.Request) -> web.Response:
    creds = bodies.parse(bodies.SessionCreate, await request.read())
    token = request.app[TOKEN].current()
    if not (same_secret(creds.user, sessions.USER) and same_secret(creds.password, token)):
        raise RedfishError(401, "InsufficientPrivilege", "user name or password not accepted")
    s = request.app[SESSIONS].create(creds.user)
    uri = uris.session_uri(s.id)
    return answer(sessions.body(s), 201, uri, {"X-Auth-Token": s.token})


async def session(request: web.Request) -> web.Response:
    s = request.app[SESSIONS].get(request.match_info["session"])
    if s is None:
        raise not_found(request.path)
    return answer(sessions.body(s))


async def logout(request: web.Request) -> web.Response:
    if not request.app[SESSIONS].delete(request.match_info["session"]):
        raise not_found(request.path)
    return answer(None, 204)


# ---- tasks ---------------------------------------------------------------------------


async def task_service(request: web.Request) -> web.Response:
    return answer(
        {
            "@odata.id": uris.TASK_SERVICE,
            "@odata.type": "#TaskService.v1_3_0.TaskService",
            "Id": "TaskService",
            "Name": "Tasks",
            "ServiceEnabled": True,
            "Status": {"State": "Enabled", "Health": "OK"},
            "Tasks": uris.link(uris.TASKS),
        }
    )


async def tasks(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    members = [redfish.task(t) for t in await fab.call(fab.store.tasks)]
    return answer(redfish.collection(uris.TASKS, "Task", members, expand(request)))


async def _task_row(request: web.Request, key: str) -> tuple[Fabric, Task]:
    fab = request.app[FABRIC]
    raw = request.match_info[key]
    t = await fab.call(fab.store.task, int(raw)) if raw.isdigit() else None
    if t is None:
        raise not_found(request.path)
    return fab, t


async def task(request: web.Request) -> web.Response:
    _, t = await _task_row(request, "task")
    return answer(redfish.task(t))


async def monitor(request: web.Request) -> web.Response:
    fab, t = await _task_row(request, "monitor")
    if not t.done:
        body = redfish.task(t)
        return answer(body, 202, uris.monitor_uri(t.id), {"Retry-After": "1"})
    if t.ended is not None and time.time() - t.ended > MONITOR_KEEP_S:
        raise not_found(request.path)
    if t.state != "Completed":
        raise RedfishError(500, "OperationFailed", f"task {t.id}: {t.message or t.state}")
    if t.kind == "attach":
        conn = await fab.call(fab.store.connection, t.connection)
        if conn is not None:
            fabric = fab.inv.targets[conn.device].fabric
            body = redfish.connection(fab.inv, conn)
            return answer(body, 201, uris.connection_uri(fabric, conn.id))
    return answer(None, 204)


# ---- events and admin ----------------------------------------------------------------


async def event_service(request: web.Request) -> web.Response:
    return answer(events.event_service())


async def event_stream(request: web.Request) -> web.StreamResponse:
    return await events.stream(request, request.app[FABRIC].events)


async def get_faults(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    return answer(await fab.call(faults.view, fab.store, fab.inv, fab.default_latency))


async def post_faults(request: web.Request) -> web.Response:
    fab = request.app[FABRIC]
    upd = bodies.parse(bodies.FaultsUpdate, await request.read())
    await fab.call(faults.apply, fab.store, fab.inv, upd)
    fab.knobs_changed()
    fab.devices_changed(sorted(upd.devices))
    return await get_faults(request)


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


def add_routes(app: web.Application) -> None:
    r = app.router
    for path in ("/redfish", "/redfish/"):
        r.add_get(path, version)
    for path in (uris.ROOT, f"{uris.ROOT}/"):
        r.add_get(path, root)
    r.add_get(f"{uris.ROOT}/odata", odata_document)
    r.add_get(f"{uris.ROOT}/$metadata", metadata)
    for base in (uris.SYSTEMS, uris.CHASSIS, accounts.SERVICE):
        r.add_get(base, static)
        r.add_get(f"{base}/{{rest:.+}}", static)
    r.add_get(uris.SESSION_SERVICE, session_service)
    r.add_get(uris.SESSIONS, session_list)
    r.add_post(uris.SESSIONS, login)
    r.add_post(f"{uris.SESSIONS}/Members", login)  # DSP0266: POST to Members = to the collection
    r.add_get(f"{uris.SESSIONS}/{{session}}", session)
    r.add_delete(f"{uris.SESSIONS}/{{session}}", logout)
    r.add_get(uris.TASK_SERVICE, task_service)
    r.add_get(uris.TASKS, tasks)
    r.add_get(f"{uris.TASKS}/{{task}}", task)
    r.add_get(f"{uris.MONITORS}/{{monitor}}", monitor)
    r.add_get(uris.EVENT_SERVICE, event_service)
    r.add_get(uris.SSE, event_stream)
    r.add_get(uris.FAULTS, get_faults)
    r.add_post(uris.FAULTS, post_faults)
    r.add_get(uris.AUDIT, audit)
    r.add_get("/healthz", healthz)
