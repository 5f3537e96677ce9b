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

One detach may take several operations (a device in two Connections):
:meth:`Operations.combine` gives them one handle, running while any runs,
failed when any failed, and, when all completed, done only when a
``check`` of the manager's state says so (the device no longer bound there),
so a detach is never reported done while the device stays attached.
:meth:`Operations.wait` gives up after ``fabric_task_max_polls`` polls
(:mod:`limits`) as after its timeout: a task monitor that never ends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from driver.backoff import Backoff
from driver.errors import FabricApiError
from driver.fabricclient import wire, wire_tasks
from driver.fabricclient.limits import TASK_MAX_POLLS
from driver.fabricclient.links import parse
from driver.fabricclient.model import FabricTask, TaskState
from driver.fabricclient.transport import Response, Transport

log = logging.getLogger(__name__)
WAIT_CAP_S = 2.0  # the slowest a task is polled
REMEMBERED = 256  # handles whose operation, device and (if done) end are remembered
# Error answers that say nothing about the operation (retry), not that it failed.
NOT_THE_OPERATION = {401, 403, 404, 408, 429, 502, 503, 504}
# What a combined handle's check says once its parts completed: state and why.
Check = Callable[[], Awaitable[tuple[TaskState, tuple[str, ...]]]]
COMBINED = "/redfish/v1/TaskService/Tasks/patchbay-"  # no manager has these: 404 after restart


@dataclass(frozen=True)
class _Combined:
    parts: tuple[str, ...]
    check: Check | None
    operation: str
    device: str
    connection_uri: str


def path_of(location: str) -> str:
    """A ``Location`` (absolute URL or path) as the path the client requests."""
    parts = urlsplit(location)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class Operations:
    """Submits operations and follows their handles (see the module docstring)."""

    def __init__(self, transport: Transport, max_polls: int = TASK_MAX_POLLS) -> None:
        self._transport = transport
        self.max_polls = max_polls
        self._known: OrderedDict[str, FabricTask] = OrderedDict()  # handle -> what it is
        self._combined: OrderedDict[str, _Combined] = OrderedDict()
        self._serial = itertools.count(1)

    def combine(
        self, tasks: Sequence[FabricTask], operation: str, device: str, check: Check | None = None
    ) -> FabricTask:
        """One handle for ``tasks`` (see the module docstring); a single task without
        a check is its own handle."""
        if len(tasks) == 1 and check is None:
            return tasks[0]
        uri = f"{COMBINED}{operation}-{device}-{next(self._serial)}"
        conn = tasks[0].connection_uri if tasks else ""
        self._combined[uri] = _Combined(tuple(t.uri for t in tasks), check, operation, device, conn)
        while len(self._combined) > REMEMBERED:
            self._combined.popitem(last=False)
        return FabricTask(wire.last_segment(uri), uri, "Running", operation, device, conn, ())

    async def _poll_combined(self, uri: str, c: _Combined) -> FabricTask:
        parts = [await self.poll(p) for p in c.parts]
        state: TaskState = "Completed"
        why = tuple(m for t in parts for m in t.messages)
        failed = [t for t in parts if t.failed]
        if any(not t.done for t in parts):
            state = "Running"
        elif failed:
            state = failed[0].state
            why = tuple(f"{t.uri}: {t.state}" for t in failed) + why
        elif c.check is not None:
            state, why = await c.check()
        task = FabricTask(wire.last_segment(uri), uri, state, c.operation, c.device,
                          c.connection_uri, why)  # fmt: skip
        return self._remember(task) if task.done else task

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
                raise FabricApiError(202, "NoTaskMonitor", "expected a Location (task monitor) "
                                     "or a Task body with a 202", method, uri)  # fmt: skip
            state: TaskState = "Running"
            if task_body is not None and not _ended(task_body.state):
                state = task_body.state
            task = FabricTask(wire.last_segment(handle), handle, state, operation, device,
                              uri if method == "DELETE" else "", _messages(task_body))  # fmt: skip
            log.info("fabric %s %s: accepted, following %s", method, uri, handle)
            return resp, self._remember(task)
        created = location if resp.status in (201, 204) else ""  # a 204 may say it too
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
        combined = self._combined.get(uri)
        if combined is not None:
            return await self._poll_combined(uri, combined)
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
        """Poll a handle until its operation ended (TimeoutError after ``timeout_s``
        or ``max_polls`` polls), every ``interval_s`` at first, then less often (up
        to ``WAIT_CAP_S``)."""
        start = time.monotonic()
        deadline = start + timeout_s
        backoff = Backoff(interval_s, max(interval_s, WAIT_CAP_S))  # a 60 s attach: ~35 polls
        for polls in itertools.count(1):
            task = await self.poll(uri)
            if task.done:
                return task
            spent = time.monotonic() - start
            if polls >= self.max_polls:
                raise TimeoutError(
                    f"fabric task {uri} ({task.operation} {task.device}) still {task.state} "
                    f"after {polls} polls in {spent:.1f} s (setting fabric_task_max_polls)"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"fabric task {uri} ({task.operation} {task.device}) still {task.state} "
                    f"after {spent:.1f} s, {polls} polls (timeout {timeout_s:g} s)"
                )
            await asyncio.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))
        raise AssertionError("unreachable")  # the loop returns or raises


def _ended(state: str) -> bool:
    return state in ("Completed", "Killed", "Exception", "Cancelled")


def _task_body(body: Any, where: str) -> wire_tasks.Task | None:
    if not isinstance(body, dict) or "TaskState" not in body:
        return None
    return parse(wire_tasks.Task, body, where)


def _messages(task: wire_tasks.Task | None) -> tuple[str, ...]:
    return tuple(m.message for m in task.messages if m.message) if task else ()


def _from_payload(payload: wire_tasks.Payload, op: str) -> tuple[str, str]:
    """(operation, device) from a Task's ``Payload`` when the client did not start it."""
    operation = op or {"POST": "attach", "DELETE": "detach"}.get(payload.operation, "")
    try:
        body = json.loads(payload.json_body) if payload.json_body else {}
        target = body["Links"]["TargetEndpoints"][0]["@odata.id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return operation, ""
    return operation, wire.last_segment(str(target))
