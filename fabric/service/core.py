"""The fabric's behaviour: attach/detach rules, the task runner, fault knobs.

Concurrency model (the whole process has one asyncio loop): every store and
simulated-host call runs on ONE worker thread (``_call``), so the
read-decide-write of an attach or detach is atomic against other requests
without locks; the loop only awaits that thread and sleeps the configured
latency (re-read while it sleeps, so lowering it releases waiting tasks).
Each task is an asyncio task that sleeps, then finishes in one worker call.

Rules: attaching a device already attached (or attaching) to the same
initiator returns that connection (and its open task); to another initiator,
or a device another tenant holds, is 409 ResourceInUse. Detach is refused
(409) while the device is flagged in use or the connection is still
attaching; a detach the host refuses (CXL memory in use) ends its task in
``Exception`` with the host's reason and leaves the device attached. An
injected failure is decided when the task is created (so a
restart does not re-roll it); the task ends in ``Exception`` and the attach
is rolled back (the connection disappears) or the detach undone (the
connection is ``Attached`` again).

Nothing is left half-done (``outcomes.py``): a task whose rollback fails
too, or that crashes, leaves its connection ``Failed``, never
``Attaching``; a new attach of the device clears a failed connection first.

Restart: tasks found ``New``/``Running`` at start are rolled *forward* -
run again from the start, latency included. Every step is idempotent (the
address is stored before the hot-add), so a task killed anywhere completes
once, and no attachment or open task is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from fabric.service import faults, outcomes, uris, vcs
from fabric.service.errors import RedfishError, in_use, not_found
from fabric.service.events import CHANGED, CREATED, REMOVED, TASK_DONE, TASK_FAILED, EventBus
from fabric.service.inventory import Inventory
from fabric.service.store import FAILED, Connection, Store, Task

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class AttachOutcome:
    connection: Connection
    task: Task | None  # None: already attached, nothing to wait for
    created: bool
    replaced: Connection | None = None  # a failed connection of the device, cleared


class Fabric:
    def __init__(self, inventory: Inventory, store: Store, latency: tuple[float, float]) -> None:
        self.inv = inventory
        self.store = store
        self.default_latency = {"attach_latency": latency[0], "detach_latency": latency[1]}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fabric-worker")
        self._running: dict[int, asyncio.Task[None]] = {}
        self.events = EventBus()
        self._knobs_changed = asyncio.Event()

    def _notify(self, message_id: str, conn: Connection, *extra: str) -> None:
        fabric = self.inv.targets[conn.device].fabric
        self.events.publish(
            message_id,
            uris.connection_uri(fabric, conn.id),
            uris.endpoint_uri(fabric, conn.device),
            *extra,
        )

    def knobs_changed(self) -> None:
        """Wake the tasks sleeping a latency: it may have been lowered."""
        self._knobs_changed.set()
        self._knobs_changed = asyncio.Event()

    def devices_changed(self, devices: list[str]) -> None:
        """Announce that these devices' state changed (faults, health)."""
        self.events.publish(
            CHANGED, *(uris.endpoint_uri(self.inv.targets[d].fabric, d) for d in devices)
        )

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self) -> None:
        await self.call(self.store.ensure_devices, sorted(self.inv.targets))
        for task in await self.call(self.store.open_tasks):
            log.info("resuming %s task %d (%s, %s)", task.kind, task.id, task.device, task.state)
            self._spawn(task.id)

    async def close(self) -> None:
        """Stop runners (their tasks stay open in the store and resume at next start)."""
        for t in self._running.values():
            t.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._pool.shutdown(wait=True)
        self.store.close()

    async def finished(self, task_id: int) -> Task | None:
        """Wait until a task's runner ends; the task as stored then."""
        running = self._running.get(task_id)
        if running is not None:
            await asyncio.gather(asyncio.shield(running), return_exceptions=True)
        return await self.call(self.store.task, task_id)

    async def idle(self) -> None:
        """Wait until no task is running (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)

    # ---- attach / detach ---------------------------------------------------------

    def record_attach_request(self, initiator: str, target: str, dialect: str) -> None:
        """Note an attach request in the test-only audit (worker thread)."""
        ini = self.inv.initiators[initiator]
        self.store.record_attach_request(target, f"{ini.node}/{ini.adapter}", dialect)

    async def attach(self, initiator: str, target: str) -> AttachOutcome:
        ini, tgt = self.inv.initiators[initiator], self.inv.targets[target]
        if (ini.fabric, ini.switch) != (tgt.fabric, tgt.switch):
            raise RedfishError(
                400,
                "ActionParameterValueConflict",
                f"{target} (switch {tgt.switch}) is not reachable from {initiator} "
                f"(switch {ini.switch})",
                related="#/Links/TargetEndpoints",
            )
        out = await self.call(self._attach_sync, initiator, target)
        if out.replaced is not None:
            self._notify(REMOVED, out.replaced)
        if out.created and out.task is not None:
            self._notify(CREATED, out.connection)
            self._spawn(out.task.id)
        return out

    def _attach_sync(self, initiator: str, target: str) -> AttachOutcome:
        if faults.attach_refused(self.store, target):
            raise RedfishError(
                400, "ActionNotSupported",
                f"attaching {target} is not supported by this fabric (fault refuseAttach)",
            )  # fmt: skip
        dev = self.store.device(target)
        if dev.foreign_owner:
            raise in_use(f"{target} is allocated to another tenant ({dev.foreign_owner})")
        conn = self.store.connection_of(target)
        failed = conn if conn is not None and conn.state == FAILED else None
        if failed is not None:  # it holds nothing: clear what it left, then attach anew
            outcomes.clear_failed(self.store, self.inv, failed)
        elif conn is not None:
            if conn.initiator != initiator:
                raise in_use(f"{target} is attached to {conn.initiator}")
            if conn.state == "Detaching":
                raise RedfishError(409, "ResourceInStandby", f"{target} is being detached")
            return AttachOutcome(conn, self.store.open_task_of(conn.id), False)
        ini = self.inv.initiators[initiator]
        if vcs.full(ini, self.store.connections()):
            raise RedfishError(
                409, "ResourceExhaustion",
                f"{ini.node} {ini.adapter}: every vPPB of its virtual switch is bound",
            )  # fmt: skip
        conn, task = self.store.start_attach(target, initiator, self.store.take("fail_attaches"))
        log.info("attach %s -> %s: connection %d, task %d", target, initiator, conn.id, task.id)
        return AttachOutcome(conn, task, True, failed)

    async def detach(self, connection: int, uri: str) -> Task:
        task, created = await self.call(self._detach_sync, connection, uri)
        if created:
            conn = await self.call(self.store.connection, connection)
            if conn is not None:
                self._notify(CHANGED, conn)
            self._spawn(task.id)
        return task

    def _detach_sync(self, connection: int, uri: str) -> tuple[Task, bool]:
        conn = self.store.connection(connection)
        if conn is None:
            raise not_found(uri)
        if conn.state == "Detaching":
            task = self.store.open_task_of(conn.id)
            if task is not None:
                return task, False
        if conn.state == "Attaching":
            what = f"connection {conn.id} of {conn.device} is still attaching"
            raise RedfishError(409, "ResourceInStandby", what)
        if self.store.device(conn.device).in_use:
            raise in_use(f"{conn.device} has running work; detach of connection {conn.id} refused")
        task = self.store.start_detach(conn, self.store.take("fail_detaches"))
        log.info("detach %s from %s: task %d", conn.device, conn.initiator, task.id)
        return task, True

    # ---- the task runner ------------------------------------------------------------

    def _spawn(self, task_id: int) -> None:
        t = asyncio.get_running_loop().create_task(self._execute(task_id), name=f"task-{task_id}")
        self._running[task_id] = t
        t.add_done_callback(lambda _: self._running.pop(task_id, None))

    async def _execute(self, task_id: int) -> None:
        try:
            task = await self.call(self._begin_sync, task_id)
            await self._sleep_latency(f"{task.kind}_latency")
            conn = await self.call(self.store.connection, task.connection)
            problem = await self.call(outcomes.finish, self.store, self.inv, task_id)
            if conn is not None and problem is not None:
                gone = await self.call(self.store.connection, conn.id) is None
                self._notify(REMOVED if gone else CHANGED, conn, uris.task_uri(task_id))
                self.events.publish(TASK_FAILED if problem else TASK_DONE, uris.task_uri(task_id))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("task %d crashed", task_id)
            conn = await self.call(outcomes.crashed, self.store, task_id, exc)
            if conn is not None:
                self._notify(CHANGED, conn, uris.task_uri(task_id))
            self.events.publish(TASK_FAILED, uris.task_uri(task_id))

    def _begin_sync(self, task_id: int) -> Task:
        self.store.set_task(task_id, "Running")
        task = self.store.task(task_id)
        assert task is not None
        return task

    def latency(self, key: str) -> float:
        return self.store.knob(key, self.default_latency[key])

    async def _sleep_latency(self, key: str) -> None:
        """Sleep the latency knob, re-read as it runs: a test can hold tasks
        with a long latency and let them finish by lowering it."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while (left := await self.call(self.latency, key) - (loop.time() - start)) > 0:
            changed = self._knobs_changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):  # not wait_for: docs/design.md
                    await changed.wait()
