"""An asyncio client of a standard Redfish fabric manager (aiohttp): the
:class:`~driver.fabricclient.protocol.FabricApi` the controller uses.

It composes the parts, each in its module: :mod:`transport` (one HTTP
exchange, credentials of :mod:`auth`, errors), :mod:`links` (a read's
fetches, ``$expand`` when offered), :mod:`inventory` and :mod:`identity`
(devices from standard resources only; no ``Oem`` is read), a
:mod:`dialect` (how attaches are asked) and :mod:`operations` (their
answers and handles).

Concurrency: coroutine methods on the caller's loop; one ``aiohttp``
session per client, safe for concurrent calls. The service root is read
once (its capabilities and links; ``/redfish/v1/``, with the slash, as
DSP0266 names it: some services answer only that); every other read is
fresh. A root without ``Fabrics`` is a service with no fabric: an empty
inventory (logged once), not an error.

The errors the controller can tell apart (``driver.errors``):
:class:`FabricUnreachable` (no answer: connection, timeout, TLS, a redirect
to another origin), :class:`FabricResourceBroken` (a resource the call
needs is broken, named by URI; an inventory itself only records broken
resources and holds back the devices in doubt), :class:`FabricAttachRefused`
(the manager refused the attach request: its 4xx; 409, attached elsewhere,
is :class:`FabricAttachConflict`, also a :class:`FabricConflict`).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncGenerator, Iterable, Mapping
from types import TracebackType
from typing import Any

import aiohttp

from driver.errors import (
    CountAttachFailed,
    FabricApiError,
    FabricAttachConflict,
    FabricAttachRefused,
    FabricMalformed,
    FabricNotFound,
    FabricUnavailable,
)
from driver.fabricclient import wire, wire_tasks
from driver.fabricclient.attachment import idempotency_key
from driver.fabricclient.auth import Auth
from driver.fabricclient.dialect import Dialect, DialectName, make_dialect
from driver.fabricclient.drives import read_drives
from driver.fabricclient.inventory import ROOT, InventoryReader
from driver.fabricclient.limits import FabricLimitsSettings
from driver.fabricclient.links import Capabilities, Links, parse
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricInventory,
    FabricTask,
    TaskState,
)
from driver.fabricclient.operations import Operations
from driver.fabricclient.token import TokenSource
from driver.fabricclient.transport import QUOTE, Transport, api_error

log = logging.getLogger(__name__)
ASKED = 1024  # attach requests whose Idempotency-Key generation is remembered


class FabricClient:
    """``auth``: a bearer token (inline or a :class:`TokenSource`) or an :class:`Auth`
    (Basic, session); ``tls``: the context that verifies an https:// fabric;
    ``server_name``: the host name its certificate must carry when it is not the
    URL's host; ``dialect``: how attaches are asked; ``systems``: system Id or
    UUID -> node, for systems whose HostName is not their node's name; ``limits``:
    the body size and task poll bounds (:mod:`limits`)."""

    def __init__(
        self,
        base_url: str,
        auth: str | TokenSource | Auth,
        timeout_s: float = 10.0,
        tls: ssl.SSLContext | None = None,
        server_name: str = "",
        dialect: DialectName | Dialect = "connections",
        systems: Mapping[str, str] | None = None,
        limits: FabricLimitsSettings | None = None,
    ) -> None:
        if isinstance(auth, str):
            auth = TokenSource(auth)
        credentials = auth if isinstance(auth, Auth) else Auth(auth)
        limits = limits or FabricLimitsSettings()
        self._transport = Transport(
            base_url, credentials, timeout_s, tls, server_name, limits.fabric_max_body_bytes
        )
        self.base_url = self._transport.base_url
        self.dialect = make_dialect(dialect) if isinstance(dialect, str) else dialect
        self._reader = InventoryReader(self.dialect, systems or {})
        self._ops = Operations(self._transport, limits.fabric_task_max_polls)
        self._root: wire.ServiceRoot | None = None
        self._caps = Capabilities()
        self._asked: dict[tuple[str, str, str, str], tuple[int, str | None]] = {}

    @property
    def picks_devices(self) -> bool:
        return self.dialect.picks_devices

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self.dialect.set_nodes(nodes)

    def set_node_uuids(self, uuids: Mapping[str, str]) -> None:
        """System UUID -> node, for systems with neither a mapping nor a HostName."""
        self._reader.node_uuids = {k.lower(): v for k, v in uuids.items()}

    async def __aenter__(self) -> FabricClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Log out (a session) and close the HTTP session."""
        await self._transport.close()

    async def root(self) -> wire.ServiceRoot:
        if self._root is None:
            root = parse(wire.ServiceRoot, await self._transport.get(ROOT + "/"), ROOT + "/")
            self._caps.expand = root.expand_query()
            if root.fabrics is None:
                log.info("fabric service root %s/ links no Fabrics: no fabric devices", ROOT)
            self._root = root
        return self._root

    async def _links(self) -> Links:
        await self.root()
        return Links(self._transport, self._caps)

    # ---- reads --------------------------------------------------------------------

    async def _read(self, links: Links) -> FabricInventory:
        root = await self.root()
        if root.fabrics is None:
            return FabricInventory((), ())
        return await self._reader.read(links, root.fabrics.odata_id)

    async def inventory(self) -> FabricInventory:
        """Every device of every fabric, with its switch, reachable adapters and connection."""
        return await self._read(await self._links())

    async def drives(self) -> list[FabricDevice]:
        """NVMe drives of the chassis and resource blocks, without reachability (a
        PCIe expansion box with no fabric)."""
        return await read_drives(await self._links())

    async def devices(self) -> list[FabricDevice]:
        return list((await self.inventory()).devices)

    async def device(self, device_id: str) -> FabricDevice:
        """One device's current state (health, availability, connection)."""
        return (await self.inventory()).device(device_id)

    async def connections(self) -> list[FabricConnection]:
        inv = await self.inventory()
        return [d.connection for d in inv.devices if d.connection is not None]

    async def events(self, idle_timeout_s: float = 60.0) -> AsyncGenerator[list[str], None]:
        """Follow the event stream at ``EventService.ServerSentEventUri``.

        Yields ``[]`` once subscribed (re-read the state now: nothing after
        this point is missed), then the origin URIs of each event. Raises
        :class:`FabricNotFound` when the service offers no stream (the
        controller then polls) and :class:`FabricUnavailable` when the stream
        breaks or stays silent past ``idle_timeout_s``.
        """
        root = await self.root()
        service = wire_tasks.EventService()
        if root.event_service is not None:
            uri = root.event_service.odata_id
            service = parse(wire_tasks.EventService, await self._transport.get(uri), uri)
        if not service.sse_uri:
            raise FabricNotFound(404, "NoEventStream", "the fabric offers no SSE stream "
                                 "(EventService.ServerSentEventUri): polling")  # fmt: skip
        async for origins in self._stream(service.sse_uri, idle_timeout_s):
            yield origins

    async def _stream(self, uri: str, idle_timeout_s: float) -> AsyncGenerator[list[str], None]:
        t = self._transport
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=t.timeout.total, sock_read=idle_timeout_s
        )
        headers = {"Accept": "text/event-stream", **await t.auth_headers()}
        try:
            async with t.session().get(
                t.base_url + uri, timeout=timeout, headers=headers, server_hostname=t.server_name,
                allow_redirects=False,  # credentials go to the fabric's origin only
            ) as r:  # fmt: skip
                if r.status >= 300:
                    body = (await r.content.read(QUOTE)).decode(errors="replace")
                    raise api_error(r.status, body, "GET", uri)
                yield []
                data: list[str] = []
                async for raw in r.content:
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line and data:
                        event = parse(wire_tasks.Event, json.loads("\n".join(data)), uri)
                        data = []
                        yield [e.origin.odata_id for e in event.events if e.origin is not None]
        except ValueError as exc:
            raise FabricMalformed(f"fabric event stream: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise t.transport_error("fabric event stream", exc) from exc
        raise FabricUnavailable("fabric event stream ended")

    async def task(self, task_uri: str) -> FabricTask:
        """One look at an operation's handle (a Task or a task monitor)."""
        return await self._ops.poll(task_uri)

    async def wait(self, task_uri: str, timeout_s: float, interval_s: float = 0.2) -> FabricTask:
        """Follow a handle until its operation ended (TimeoutError after ``timeout_s``)."""
        return await self._ops.wait(task_uri, timeout_s, interval_s)

    # ---- attach / detach --------------------------------------------------------------

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        """Attach ``device_id`` to ``node`` through ``adapter``, asked once per call.

        Already attached there: no request, ``task`` None. Attached elsewhere or
        held by another tenant: :class:`FabricConflict` (from the fabric). ``key``
        (the caller's allocation) goes into the Idempotency-Key.
        """
        links = await self._links()
        dev = (await self._read(links)).device(device_id)
        via = [a for a in dev.adapters if (a.node, a.adapter) == (node, adapter)]
        if not via:
            raise FabricNotFound(
                404, "ResourceNotFound", f"{device_id} is not reachable from {node}/{adapter}"
            )
        for conn in dev.connections:
            if (conn.node, conn.adapter, conn.state) == (node, adapter, "Attached"):
                log.info("fabric attach %s -> %s/%s: already attached", device_id, node, adapter)
                return AttachResult(conn.uri, None)
        # One Idempotency-Key per attach request of (device, node, adapter, key): a
        # repeat while it runs reuses it, a new request after it ended gets a new one.
        ask = (device_id, node, adapter, key)
        generation, handle = self._asked.pop(ask, (0, None))
        if handle is not None and (not handle or self._ops.ended(handle)):
            generation += 1
        ikey = idempotency_key(device_id, node, adapter, f"{key}#{generation}")
        try:
            result = await self.dialect.attach(self._ops, links, dev, via[0], ikey)
        except CountAttachFailed:  # what arrived was given back (or nothing came): asking
            self._asked[ask] = (generation, "")  # again is a new request, not a replay
            raise
        except FabricApiError as exc:
            if exc.status < 500:  # answered: asking again is a new request, not a replay
                self._asked[ask] = (generation, "")  # (the answer may be kept under the key)
            mapped = refused(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        self._asked[ask] = (generation, result.task.uri if result.task else "")
        while len(self._asked) > ASKED:
            self._asked.pop(next(iter(self._asked)))
        return result

    async def detach(self, device_id: str) -> FabricTask | None:
        """Detach ``device_id`` from the node it is attached to (every binding of it to
        that node); None if it is not attached. The handle's task is Completed only
        once the manager shows no binding of it to that node any more."""
        links = await self._links()
        dev = (await self._read(links)).device(device_id)
        if dev.connection is None:
            return None
        node = dev.connection.node
        task = await self.dialect.detach(self._ops, links, dev)
        if task is None:
            return None

        async def check() -> tuple[TaskState, tuple[str, ...]]:
            left = (await self.inventory()).device(device_id).bound_to(node)
            if not left:
                return "Completed", ()
            what = tuple(f"{c.uri}: {c.state}" for c in left)
            if all(c.state == "Detaching" for c in left):
                return "Running", what
            why = f"{device_id} is still bound to {node or '?'} after its detach ended"
            return "Exception", (why, *what)

        return self._ops.combine([task], "detach", device_id, check)


def refused(exc: FabricApiError) -> FabricApiError:
    """An attach request's error answer as the attach refused (4xx, not 401/403/404)."""
    if isinstance(exc, (FabricAttachRefused, CountAttachFailed)) or not 400 <= exc.status < 500:
        return exc
    if exc.status in (401, 403, 404, 408, 429):
        return exc
    cls = FabricAttachConflict if exc.status == 409 else FabricAttachRefused
    return cls(exc.status, exc.code, exc.message, exc.method, exc.uri)
