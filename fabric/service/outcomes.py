"""How a task's end leaves its connection: attached, gone, or failed; never half-done.

Why a module: the task runner (``core.py``) decides *when* a task ends; this
decides what the end does to the store and the simulated host, which is
where a half-made connection would come from. Every outcome leaves the
connection in a state that answers the next request on its merits:

- an attach ends ``Attached``, or is rolled back (injected failure, a
  ``Critical`` device, a hot-add undone): the connection disappears;
- a detach ends with the connection gone, or ``Attached`` again (injected
  failure, the host refused: CXL memory in use, nothing changed);
- an attach whose hot-add broke half-way and whose undo failed too, a
  hot-remove that broke half-way, or a task that crashed, end in
  ``Exception`` and leave the connection ``Failed`` (Redfish
  ``Status.State`` ``UnavailableOffline``, ``Health`` ``Critical``), never
  ``Attaching`` or ``Detaching``.

A failed connection holds nothing: a detach of it hot-removes what is
left, and a new attach of its device first removes what is left
(:func:`clear_failed`; 409 naming the connection if the host refuses).

Concurrency: called on the service's worker thread only (``core.py``).
"""

from __future__ import annotations

import logging

from driver.errors import DeviceError
from fabric.service import hosts
from fabric.service.errors import in_use
from fabric.service.inventory import Inventory
from fabric.service.store import FAILED, Connection, Store, Task

log = logging.getLogger(__name__)


def finish(store: Store, inv: Inventory, task_id: int) -> str | None:
    """Finish a task; its problem ("" when none), None when it had nothing to act on."""
    task = store.task(task_id)
    conn = store.connection(task.connection) if task else None
    if task is None or conn is None:
        log.error("task %d lost its connection", task_id)
        if task is not None:
            store.set_task(task_id, "Exception", "connection vanished")
        return None
    node = inv.initiators[conn.initiator].node
    if task.kind == "attach":
        problem = _attach_problem(store, task, node)
        if problem:
            store.delete_connection(conn.id)
        else:
            problem = _hot_add(store, inv, conn)
    elif task.fail:
        problem = f"injected failure: detach of {conn.device} from {node} failed"
        store.set_connection(conn.id, state="Attached")
    else:
        problem = _hot_remove(store, inv, conn)
    store.set_task(task_id, "Exception" if problem else "Completed", problem)
    log.info("task %d (%s %s): %s", task_id, task.kind, conn.device, problem or "completed")
    return problem


def crashed(store: Store, task_id: int, exc: Exception) -> Connection | None:
    """End a task that crashed; its connection, if one was under way, is failed now."""
    store.set_task(task_id, "Exception", f"internal error: {exc}")
    task = store.task(task_id)
    conn = store.connection(task.connection) if task is not None else None
    if conn is None or conn.state not in ("Attaching", "Detaching"):
        return None
    store.set_connection(conn.id, state=FAILED)
    log.error("task %d crashed: connection %d of %s failed", task_id, conn.id, conn.device)
    return conn


def clear_failed(store: Store, inv: Inventory, conn: Connection) -> None:
    """Remove what a failed connection left on its host, then the connection."""
    ini, tgt = inv.initiators[conn.initiator], inv.targets[conn.device]
    try:
        hosts.remove(ini, tgt, conn.bdf)
    except (OSError, DeviceError) as exc:
        raise in_use(
            f"connection {conn.id} of {conn.device} failed, and what it left on "
            f"{ini.node} cannot be removed: {exc}"
        ) from exc
    store.delete_connection(conn.id)
    log.info("failed connection %d of %s cleared from %s", conn.id, conn.device, ini.node)


def _attach_problem(store: Store, task: Task, node: str) -> str:
    if task.fail:
        return f"injected failure: attach of {task.device} to {node} failed"
    if store.device(task.device).health == "Critical":
        return f"{task.device} reports a critical fault"
    return ""


def _hot_add(store: Store, inv: Inventory, conn: Connection) -> str:
    """Hot-add the connection's device; its problem ("" when attached)."""
    ini, tgt = inv.initiators[conn.initiator], inv.targets[conn.device]
    bdf = conn.bdf or hosts.plan(ini)
    store.set_connection(conn.id, bdf=bdf)  # before the add: a resumed task is idempotent
    problem, undone = hosts.add_or_undo(ini, tgt, bdf)
    if not problem:
        store.set_connection(conn.id, state="Attached")
    elif undone:
        store.delete_connection(conn.id)
    else:
        store.set_connection(conn.id, state=FAILED)
        problem += f" (connection {conn.id} failed: detach it, or attach again)"
    return problem


def _hot_remove(store: Store, inv: Inventory, conn: Connection) -> str:
    """Hot-remove the connection's device; its problem ("" when gone)."""
    ini, tgt = inv.initiators[conn.initiator], inv.targets[conn.device]
    try:
        hosts.remove(ini, tgt, conn.bdf)
    except DeviceError as exc:  # the host refused: still attached, say why
        store.set_connection(conn.id, state="Attached")
        return str(exc)
    except OSError as exc:  # broke half-way: what is left is unknown
        store.set_connection(conn.id, state=FAILED)
        return (
            f"hot-remove of {conn.device} from {ini.node} failed: {exc} "
            f"(connection {conn.id} failed: detach it again)"
        )
    store.delete_connection(conn.id)
    return ""
