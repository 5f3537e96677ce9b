"""An in-memory fabric: the :class:`~driver.fabricclient.protocol.FabricApi`
double that ships with patchbay, as the NVML fake does.

It holds fabric devices (with the adapters that reach them) and their
connections. An attach through an adapter that reaches the device connects
it: at once (``instant``, the default; the answer carries no task), or
through a Running task that :meth:`finish` completes or fails; attaching
where it is attached already answers the connection, elsewhere
:class:`~driver.errors.FabricConflict`. A detach ends the connection
(a Completed task; None when nothing is attached). Every attach and detach
is logged (:attr:`attached`, :attr:`detached`) and signalled on the event
stream. Test hooks: :meth:`pause` holds inventory reads until released,
:meth:`fail` makes the next calls of a method raise, :meth:`notify` sends
an event.

Concurrency: one asyncio loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from driver.errors import FabricConflict, FabricNotFound, PatchbayError
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricInventory,
    FabricTask,
    HostAdapter,
    TaskState,
)


class MemoryFabric:
    """The in-memory fabric (see the module docstring)."""

    def __init__(
        self,
        devices: Sequence[FabricDevice] = (),
        adapters: Sequence[HostAdapter] = (),
        *,
        instant: bool = True,
    ) -> None:
        self.devices = {d.id: d for d in devices}
        self.adapters = list(adapters) or sorted(
            {a for d in devices for a in d.adapters}, key=lambda a: a.endpoint
        )
        self.instant = instant
        self.attached: list[tuple[str, str, str]] = []
        self.detached: list[str] = []
        self.tasks: dict[str, FabricTask] = {}
        self._ids = itertools.count(1)
        self._events: set[asyncio.Queue[list[str]]] = set()
        self._paused: asyncio.Event | None = None
        self._failures: dict[str, list[PatchbayError]] = {}
        self._changed = asyncio.Event()
        self.node_uuids: dict[str, str] = {}

    # -- test hooks ---------------------------------------------------------

    def pause(self) -> asyncio.Event:
        """Inventory reads wait until the returned event is set."""
        self._paused = asyncio.Event()
        return self._paused

    def fail(self, method: str, error: PatchbayError, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` raise ``error``."""
        self._failures.setdefault(method, []).extend([error] * times)

    def notify(self, *origins: str) -> None:
        """An event on the stream (the origin URIs it names)."""
        for queue in self._events:
            queue.put_nowait(list(origins))

    def finish(self, task_uri: str, *, ok: bool = True, message: str = "") -> None:
        """Complete (or fail) a Running attach task."""
        task = self.tasks[task_uri]
        dev = self.devices[task.device]
        assert dev.connection is not None
        if ok:
            conn = replace(dev.connection, state="Attached", task_uri=None,
                           pci_bus_id=f"0000:{0x40 + len(self.attached):02x}:00.0")  # fmt: skip
            self.devices[dev.id] = replace(dev, connection=conn, in_use=True)
        else:
            self.devices[dev.id] = replace(dev, connection=None)
        state: TaskState = "Completed" if ok else "Exception"
        self.tasks[task_uri] = replace(task, state=state, messages=(message,) if message else ())
        self._changed.set()
        self.notify(task_uri)

    # -- FabricApi ----------------------------------------------------------

    picks_devices = False  # it attaches the device it is asked for

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        return None  # adapters name their nodes

    def set_node_uuids(self, uuids: Mapping[str, str]) -> None:
        """Adapters without a node are named by their system UUID (as the client does)."""
        self.node_uuids = {k.lower(): v for k, v in uuids.items()}

    def _named(self, a: HostAdapter) -> HostAdapter:
        node = a.node or self.node_uuids.get(a.system_uuid.lower(), "")
        return replace(a, node=node) if node != a.node else a

    async def inventory(self) -> FabricInventory:
        self._raise("inventory")
        if self._paused is not None:
            await self._paused.wait()
        if not self.node_uuids:
            return FabricInventory(tuple(self.devices.values()), tuple(self.adapters))
        devices = tuple(
            replace(d, adapters=tuple(self._named(a) for a in d.adapters))
            for d in self.devices.values()
        )
        return FabricInventory(devices, tuple(self._named(a) for a in self.adapters))

    async def device(self, device_id: str) -> FabricDevice:
        self._raise("device")
        return self._device(device_id)

    async def events(self, idle_timeout_s: float = 60.0) -> AsyncGenerator[list[str], None]:
        self._raise("events")
        queue: asyncio.Queue[list[str]] = asyncio.Queue()
        self._events.add(queue)
        try:
            yield []
            while True:
                yield await queue.get()
        finally:
            self._events.discard(queue)

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        self._raise("attach")
        dev = self._device(device_id)
        if not [a for a in dev.adapters if (a.node, a.adapter) == (node, adapter)]:
            raise FabricNotFound(404, "ResourceNotFound",
                                 f"{device_id} is not reachable from {node}/{adapter}")  # fmt: skip
        conn = dev.connection
        if conn is not None:
            if (conn.node, conn.adapter) != (node, adapter):
                where = f"{conn.node}/{conn.adapter}"
                raise FabricConflict(409, "ResourceInUse", f"{device_id} is attached to {where}")
            task = self.tasks.get(conn.task_uri) if conn.task_uri else None
            return AttachResult(conn.uri, task)
        n = next(self._ids)
        uri = f"/redfish/v1/Fabrics/{dev.fabric}/Connections/c{n}"
        self.attached.append((device_id, node, adapter))
        conn = FabricConnection(f"c{n}", uri, device_id, node, adapter, "Attaching", "", None)
        self.devices[device_id] = replace(dev, connection=conn)
        if self.instant:
            self.finish(self._task(n, "attach", device_id, uri, "Running").uri)
            return AttachResult(uri, None)
        task = self._task(n, "attach", device_id, uri, "Running")
        self.devices[device_id] = replace(dev, connection=replace(conn, task_uri=task.uri))
        self.notify(uri)
        return AttachResult(uri, task)

    async def detach(self, device_id: str) -> FabricTask | None:
        self._raise("detach")
        dev = self._device(device_id)
        if dev.connection is None:
            return None
        self.detached.append(device_id)
        self.devices[device_id] = replace(dev, connection=None, in_use=False)
        task = self._task(next(self._ids), "detach", device_id, dev.connection.uri, "Completed")
        self._changed.set()
        self.notify(dev.connection.uri)
        return task

    async def task(self, task_uri: str) -> FabricTask:
        self._raise("task")
        try:
            return self.tasks[task_uri]
        except KeyError:
            raise FabricNotFound(404, "ResourceNotFound", f"no task {task_uri}") from None

    async def wait(self, task_uri: str, timeout_s: float, interval_s: float = 0.2) -> FabricTask:
        async def done() -> FabricTask:
            while not (task := await self.task(task_uri)).done:
                self._changed.clear()
                await self._changed.wait()
            return task

        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: docs/design.md
                return await done()
        except TimeoutError:
            raise TimeoutError(f"fabric task {task_uri} still Running") from None

    # -- internals ----------------------------------------------------------

    def _raise(self, method: str) -> None:
        pending = self._failures.get(method)
        if pending:
            raise pending.pop(0)

    def _device(self, device_id: str) -> FabricDevice:
        try:
            return self.devices[device_id]
        except KeyError:
            raise FabricNotFound(
                404, "ResourceNotFound", f"no fabric device {device_id!r}"
            ) from None

    def _task(
        self, n: int, operation: str, device: str, conn_uri: str, state: TaskState
    ) -> FabricTask:
        uri = f"/redfish/v1/TaskService/Tasks/t{n}"
        task = FabricTask(f"t{n}", uri, state, operation, device, conn_uri, ())
        self.tasks[uri] = task
        return task
