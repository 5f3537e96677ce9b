"""A fabric operation's answer and its handle: Task, DSP0266 task monitor, or none.

Why a module: a Redfish service may answer a POST, PATCH or DELETE in
several standard ways and the controller must not care which:

- ``200``/``201``/``204``: done (a 201's ``Location`` is the new resource);
- ``202 Accepted``: still running; ``Location`` is a task monitor (DSP0266:
  GET answers 202 while the operation runs, then the operation's own final
  status and body; 404 once consumed or expired), and the body is often the
  Task. Without ``Location``, the Task's ``@odata.id`` is the handle.

:meth:`Operations.poll` looks at a handle once, whichever it is: 202 is
running (the Task body's state when it says more), a Task body its
``TaskState`` (13 values; Killed, Cancelled and Exception end badly), any
other success the operation's final answer (Completed), an error answer
the operation's failure (Exception, with the message). A handle gone (404)
raises :class:`FabricNotFound`: the controller then reads the connection
state from the inventory. An operation answered at once gets a Completed
task remembered under a handle of its own, so ``wait`` on it returns at
once as it does for the in-memory fabric.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from driver.backoff import Backoff
from driver.errors import FabricApiError
from driver.fabricclient import wire
from driver.fabricclient.links import parse
from driver.fabricclient.model import FabricTask, TaskState
from driver.fabricclient.transport import Response, Transport

log = logging.getLogger(__name__)
WAIT_CAP_S = 2.0  # the slowest a task is polled
REMEMBERED = 256  # handles whose operation, device and (if done) end are remembered
# Error answers that say nothing about the operation (retry), not that it failed.
NOT_THE_OPERATION = {401, 403, 404, 408, 429, 502, 503, 504}


def path_of(location: str) -> str:
    """A ``Location`` (absolute URL or path) as the path the client requests."""
    parts = urlsplit(location)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class Operations:
    """Submits operations and follows their handles (see the module docstring)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._known: OrderedDict[str, FabricTask] = OrderedDict()  # handle -> what it is

    def _remember(self, task: FabricTask) -> FabricTask:
        self._known[task.uri] = task
        self._known.move_to_end(task.uri)
        while len(self._known) > REMEMBERED:
            self._known.popitem(last=False)
        return task

    async def submit(
        self, method: str, uri: str, body: dict[str, Any] | None, headers: dict[str, str],
        operation: str, device: str,
    ) -> tuple[Response, FabricTask]:  # fmt: skip
        """Send the operation; the answer and its task (``done`` when answered at once)."""
        resp = await self._transport.request(method, uri, body, headers)
        location = path_of(resp.headers.get("Location", ""))
        task_body = _task_body(resp.body, f"{method} {uri}")
        if resp.status == 202:
            handle = location or (task_body.odata_id if task_body else "")
            if not handle:
                raise FabricApiError(202, "NoTaskMonitor", f"{method} {uri}: 202 without Location")
            state: TaskState = "Running"
            if task_body is not None and not _ended(task_body.state):
                state = task_body.state
            task = FabricTask(wire.last_segment(handle), handle, state, operation, device,
                              uri if method == "DELETE" else "", _messages(task_body))  # fmt: skip
            log.info("fabric %s %s: accepted, following %s", method, uri, handle)
            return resp, self._remember(task)
        created = location if resp.status == 201 else ""
        if not created and isinstance(resp.body, dict) and task_body is None:
            created = str(resp.body.get("@odata.id", ""))
        target = created if method == "POST" else uri  # the connection (zone), if known
        done = FabricTask("", f"{target or uri}#{operation}", "Completed", operation, device,
                          target, _messages(task_body))  # fmt: skip
        return resp, self._remember(done)

    def ended(self, uri: str) -> bool:
        """Whether the operation of handle ``uri`` was last seen ended (or is forgotten)."""
        known = self._known.get(uri)
        return known is None or known.done

    async def poll(self, uri: str) -> FabricTask:
        """One look at a handle."""
        known = self._known.get(uri)
        if known is not None and known.done:
            return known
        op, device, conn = ("", "", "") if known is None else (
            known.operation, known.device, known.connection_uri
        )  # fmt: skip
        try:
            resp = await self._transport.request("GET", uri)
        except FabricApiError as exc:
            if exc.status in NOT_THE_OPERATION:
                raise
            failed = FabricTask(wire.last_segment(uri), uri, "Exception", op, device, conn,
                                (exc.message,))  # fmt: skip
            return self._remember(failed)
        body = _task_body(resp.body, uri)
        if body is not None and body.payload is not None and not device:
            op, device = _from_payload(body.payload, op)
        state: TaskState = "Completed"
        if body is not None:
            state = body.state
        if resp.status == 202 and _ended(state):
            state = "Running"  # the monitor says it is not over yet
        ident = (body.id if body else "") or wire.last_segment(uri)
        task = FabricTask(ident, uri, state, op, device, conn, _messages(body))
        return self._remember(task) if known is not None or task.done else task

    async def wait(self, uri: str, timeout_s: float, interval_s: float = 0.2) -> FabricTask:
        """Poll a handle until its operation ended (TimeoutError after ``timeout_s``),
        every ``interval_s`` at first, then less often (up to ``WAIT_CAP_S``)."""
        deadline = time.monotonic() + timeout_s
        backoff = Backoff(interval_s, max(interval_s, WAIT_CAP_S))  # a 60 s attach: ~35 polls
        while True:
            task = await self.poll(uri)
            if task.done:
                return task
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fabric task {uri} still {task.state}")
            await asyncio.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))


def _ended(state: str) -> bool:
    return state in ("Completed", "Killed", "Exception", "Cancelled")


def _task_body(body: Any, where: str) -> wire.Task | None:
    if not isinstance(body, dict) or "TaskState" not in body:
        return None
    return parse(wire.Task, body, where)


def _messages(task: wire.Task | None) -> tuple[str, ...]:
    return tuple(m.message for m in task.messages if m.message) if task else ()


def _from_payload(payload: wire.Payload, op: str) -> tuple[str, str]:
    """(operation, device) from a Task's ``Payload`` when the client did not start it."""
    operation = op or {"POST": "attach", "DELETE": "detach"}.get(payload.operation, "")
    try:
        body = json.loads(payload.json_body) if payload.json_body else {}
        target = body["Links"]["TargetEndpoints"][0]["@odata.id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return operation, ""
    return operation, wire.last_segment(str(target))
