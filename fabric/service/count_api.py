"""The count face's routes: machines, scale up and down, and its test-only faults.

Why a module: this is the HTTP surface of the third dialect (shapes in
``count_wire``, decisions in ``count_machines``). A scale-up attaches through
the same :class:`Fabric` as the Redfish faces, so a device the count face
attached is a Connection there too (and the other way round), and answers
once the attach task has ended (the manager's ``PATCH`` answers with the
resources it added). Picking and starting an attach happen under one lock,
so two scale-ups never take the same device. A scale-up may carry an
``Idempotency-Key``: a repeat answers the first answer and attaches nothing
more. Scale-down detaches by ``res_uuid`` and answers once it has ended.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from driver.fabricclient.token import TokenSource
from fabric.service import count_machines as cm
from fabric.service.answers import FABRIC, ONCE
from fabric.service.count_auth import TOKENS, Tokens, require_bearer, token
from fabric.service.count_wire import (
    FAULTS,
    ISSUED,
    MACHINES,
    TOKEN,
    CountFaults,
    FmError,
    ScaleDown,
    ScaleUp,
    model_of,
    parse,
)
from fabric.service.store import Store

log = logging.getLogger(__name__)
PICK_LOCK = web.AppKey("count_pick_lock", asyncio.Lock)


def _tenant(request: web.Request) -> str:
    require_bearer(request)
    tenant = request.query.get("tenant_uuid", "")
    if not tenant:
        raise FmError(400, "E40003", "tenant_uuid: query parameter required")
    return tenant


def _same(field: str, got: str, want: str) -> None:
    if got != want:
        raise FmError(400, "E40004", f"{field}: {got!r} does not match {want!r}")


async def get_machines(request: web.Request) -> web.Response:
    tenant, fab = _tenant(request), request.app[FABRIC]
    out = []
    for m in cm.machines(fab.inv).values():
        res = await fab.call(cm.attached, fab.inv, fab.store, m)
        out.append(await fab.call(cm.machine_json, fab.inv, fab.store, m, tenant, res))
    return web.json_response({"data": {"machines": out}})


async def get_machine(request: web.Request) -> web.Response:
    tenant, fab = _tenant(request), request.app[FABRIC]
    m = cm.machine_of(fab.inv, request.match_info["mach"])
    res = await fab.call(cm.attached, fab.inv, fab.store, m)
    body = await fab.call(cm.machine_json, fab.inv, fab.store, m, tenant, res)
    return web.json_response({"data": {"machines": [body]}})


async def scale_up(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    return await request.app[ONCE].once(request, lambda: _scale_up(request, tenant))


async def _scale_up(request: web.Request, tenant: str) -> web.Response:
    fab = request.app[FABRIC]
    body = parse(ScaleUp, await request.read())
    _same("tenants.tenant_uuid", body.tenants.tenant_uuid, tenant)
    want = body.tenants.machines[0]
    _same("tenants.machines.0.mach_uuid", want.mach_uuid, request.match_info["mach"])
    m = cm.machine_of(fab.inv, want.mach_uuid)
    added = []
    for spec in (s for r in want.resources for s in r.res_specs):
        model = model_of(spec)
        for _ in range(spec.res_num):
            async with request.app[PICK_LOCK]:
                chosen = await fab.call(cm.pick, fab.inv, fab.store, m, spec.res_type, model)
                if chosen is None:
                    log.warning("scale-up %s of %s: fault, nothing attached", m.node, model)
                    continue
                target, via = chosen
                out = await fab.attach(via.id, target.id)
            task = await fab.finished(out.task.id) if out.task else None
            if task is not None and task.state != "Completed":
                raise FmError(
                    500, "E50000", f"attach of {target.id} to {m.node} failed: {task.message}"
                )
            log.info("scale-up %s: %s (%s) for %s", m.node, target.id, target.model, model)
            added.append(target)
    reply = await fab.call(cm.machine_json, fab.inv, fab.store, m, tenant, added)
    return web.json_response({"data": {"machines": [reply]}})


async def scale_down(request: web.Request) -> web.Response:
    tenant, fab = _tenant(request), request.app[FABRIC]
    body = parse(ScaleDown, await request.read())
    _same("tenants.tenant_uuid", body.tenants.tenant_uuid, tenant)
    want = body.tenants.machines[0]
    _same("tenants.machines.0.mach_uuid", want.mach_uuid, request.match_info["mach"])
    m = cm.machine_of(fab.inv, want.mach_uuid)
    mine = {i.id for i in m.initiators}
    for spec in (s for r in want.resources for s in r.res_specs):
        target = cm.resource_by_uuid(fab.inv, spec.res_uuid)
        conn = await fab.call(fab.store.connection_of, target.id)
        if conn is None or conn.initiator not in mine:
            raise FmError(
                404, "E40402", f"res_uuid {spec.res_uuid} is not attached to machine {m.uuid}"
            )
        task = await fab.finished((await fab.detach(conn.id, request.path)).id)
        if task is not None and task.state != "Completed":
            raise FmError(409, "E40901", f"detach of {target.id} failed: {task.message}")
        log.info("scale-down %s: %s", m.node, target.id)
    res = await fab.call(cm.attached, fab.inv, fab.store, m)
    reply = await fab.call(cm.machine_json, fab.inv, fab.store, m, tenant, res)
    return web.json_response({"data": {"machines": [reply]}})


def _set_faults(store: Store, upd: CountFaults) -> dict[str, int]:
    for key, value in ((cm.WRONG_MODEL, upd.wrong_model_next), (cm.NOTHING, upd.nothing_next)):
        if value is not None:
            store.set_knob(key, float(value))
    return {
        "wrongModelNext": int(store.knob(cm.WRONG_MODEL)),
        "nothingNext": int(store.knob(cm.NOTHING)),
    }


async def faults(request: web.Request) -> web.Response:
    """Test-only: GET the count faults, or POST ``{wrongModelNext, nothingNext}``."""
    fab = request.app[FABRIC]
    upd = parse(CountFaults, await request.read()) if request.method == "POST" else CountFaults()
    return web.json_response(await fab.call(_set_faults, fab.store, upd))


def add_routes(app: web.Application, secret: TokenSource) -> None:
    app[TOKENS] = tokens = Tokens(secret)
    app[ISSUED] = tokens.valid
    app[PICK_LOCK] = asyncio.Lock()
    r = app.router
    r.add_post(TOKEN.format(realm="{realm}"), token)
    r.add_get(MACHINES, get_machines)
    r.add_get(f"{MACHINES}/{{mach}}", get_machine)
    r.add_patch(f"{MACHINES}/{{mach}}/update", scale_up)
    r.add_delete(f"{MACHINES}/{{mach}}/update", scale_down)
    r.add_get(FAULTS, faults)
    r.add_post(FAULTS, faults)
