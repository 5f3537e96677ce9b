"""An asyncio client of the fabric's Redfish API (aiohttp).

Concurrency: coroutine methods on the caller's loop; one ``aiohttp``
session per client, safe for concurrent calls. Every response body is
validated through ``wire.py`` before use; Redfish error bodies become
:class:`FabricApiError` (409 :class:`FabricConflict`, 404
:class:`FabricNotFound`), transport failures :class:`FabricUnavailable`
(a refused TLS certificate :class:`FabricTlsError`, saying why), bodies of
the wrong shape :class:`FabricMalformed`. Each request carries the token
source's current token (a rotated token file is used from the next request).

Listing costs one request for the fabrics plus two per fabric (endpoints
and connections, with ``$expand=.``). A device is reachable from every
initiator endpoint on its switch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any, Literal

import aiohttp
from pydantic import ValidationError

from driver.backoff import Backoff
from driver.errors import (
    FabricApiError,
    FabricConflict,
    FabricMalformed,
    FabricNotFound,
    FabricTlsError,
    FabricUnavailable,
)
from driver.fabricclient import wire
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricInventory,
    FabricTask,
    HostAdapter,
)
from driver.fabricclient.token import TokenSource

log = logging.getLogger(__name__)
ROOT = "/redfish/v1"
WAIT_CAP_S = 2.0  # the slowest a task is polled


class FabricClient:
    """``tls``: the context that verifies an https:// fabric (default: the
    system's trust store); ``server_name``: the host name its certificate
    must carry when it is not the URL's host."""

    def __init__(
        self,
        base_url: str,
        token: str | TokenSource,
        timeout_s: float = 10.0,
        tls: ssl.SSLContext | None = None,
        server_name: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = TokenSource(token) if isinstance(token, str) else token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tls = tls
        self._server_name = server_name or None
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls else None
            self._session = aiohttp.ClientSession(
                headers={"Accept": "application/json"}, timeout=self._timeout, connector=connector
            )
        return self._session

    def _auth(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token.current()}", **(extra or {})}

    def _transport_error(self, what: str, exc: Exception) -> FabricUnavailable:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            host = self._server_name or exc.host
            return FabricTlsError(
                f"{what}: the fabric's TLS certificate was refused for host {host}"
                f" (wrong CA bundle, host name or expired?): {exc.certificate_error}"
            )
        return FabricUnavailable(f"{what}: {exc}")

    async def __aenter__(self) -> FabricClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- HTTP -------------------------------------------------------------------

    async def _request(
        self, method: str, uri: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        session = self._open()
        try:
            async with session.request(
                method, self.base_url + uri, json=body, headers=self._auth(),
                server_hostname=self._server_name,
            ) as resp:  # fmt: skip
                raw = await resp.read()
                status, headers = resp.status, dict(resp.headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._transport_error(f"fabric {method} {uri}", exc) from exc
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise FabricMalformed(f"fabric {method} {uri}: body is not JSON: {exc}") from exc
        if status >= 400:
            raise _api_error(status, data)
        if not isinstance(data, dict):
            raise FabricMalformed(f"fabric {method} {uri}: body is not a JSON object")
        return status, headers, data

    async def _get(self, uri: str) -> dict[str, Any]:
        return (await self._request("GET", uri))[2]

    async def _members(self, uri: str) -> list[dict[str, Any]]:
        data = await self._get(f"{uri}?$expand=.")
        return _parse(wire.Collection, data, uri).members

    # ---- reads --------------------------------------------------------------------

    async def inventory(self) -> FabricInventory:
        """Every device of every fabric, with its switch, reachable adapters and connection."""
        devices: list[FabricDevice] = []
        adapters: list[HostAdapter] = []
        for fab in await self._members(f"{ROOT}/Fabrics"):
            fid = str(fab.get("Id", ""))
            base = f"{ROOT}/Fabrics/{fid}"
            eps = [
                _parse(wire.Endpoint, m, f"{base}/Endpoints")
                for m in await self._members(f"{base}/Endpoints")
            ]
            conns = [
                _connection(_parse(wire.Connection, m, f"{base}/Connections"), eps)
                for m in await self._members(f"{base}/Connections")
            ]
            fab_adapters = [_adapter(fid, e) for e in eps if e.role == "Initiator"]
            adapters += fab_adapters
            by_device = {c.device: c for c in conns}
            for e in eps:
                if e.role == "Target":
                    devices.append(_device(fid, e, fab_adapters, by_device.get(e.id)))
        return FabricInventory(tuple(devices), tuple(adapters))

    async def devices(self) -> list[FabricDevice]:
        return list((await self.inventory()).devices)

    async def device(self, device_id: str) -> FabricDevice:
        """One device's current state (health, availability, connection)."""
        return (await self.inventory()).device(device_id)

    async def connections(self) -> list[FabricConnection]:
        inv = await self.inventory()
        return [d.connection for d in inv.devices if d.connection is not None]

    async def events(self, idle_timeout_s: float = 60.0) -> AsyncGenerator[list[str], None]:
        """Follow the Redfish event stream (``EventService/SSE``).

        Yields ``[]`` once subscribed (re-read the state now: nothing after
        this point is missed), then the origin URIs of each event. Raises
        :class:`FabricApiError` when the service has no event stream and
        :class:`FabricUnavailable` when the stream breaks or stays silent
        past ``idle_timeout_s`` (the service sends keep-alives).
        """
        session = self._open()
        uri = f"{ROOT}/EventService/SSE"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout.total, sock_read=idle_timeout_s
        )
        headers = self._auth({"Accept": "text/event-stream"})
        try:
            async with session.get(
                self.base_url + uri, timeout=timeout, headers=headers,
                server_hostname=self._server_name,
            ) as r:  # fmt: skip
                if r.status >= 400:
                    raise _api_error(r.status, await r.json(content_type=None))
                yield []
                data: list[str] = []
                async for raw in r.content:
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line and data:
                        event = _parse(wire.Event, json.loads("\n".join(data)), uri)
                        data = []
                        yield [e.origin.odata_id for e in event.events if e.origin is not None]
        except ValueError as exc:
            raise FabricMalformed(f"fabric event stream: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._transport_error("fabric event stream", exc) from exc
        raise FabricUnavailable("fabric event stream ended")

    async def task(self, task_uri: str) -> FabricTask:
        return _task(_parse(wire.Task, await self._get(task_uri), task_uri))

    async def wait(self, task_uri: str, timeout_s: float, interval_s: float = 0.2) -> FabricTask:
        """Poll a task until it is Completed or Exception (TimeoutError after ``timeout_s``),
        every ``interval_s`` at first, then less often (up to ``WAIT_CAP_S``)."""
        deadline = time.monotonic() + timeout_s
        backoff = Backoff(interval_s, max(interval_s, WAIT_CAP_S))  # a 60 s attach: ~35 polls
        while True:
            task = await self.task(task_uri)
            if task.done:
                return task
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fabric task {task_uri} still {task.state}")
            await asyncio.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))

    # ---- attach / detach --------------------------------------------------------------

    async def attach(self, device_id: str, node: str, adapter: str) -> AttachResult:
        """Attach ``device_id`` to ``node`` through ``adapter``.

        Already attached there: ``task`` None (or the still-open task).
        Attached elsewhere or held by another tenant: :class:`FabricConflict`.
        """
        dev = (await self.inventory()).device(device_id)
        via = [a for a in dev.adapters if (a.node, a.adapter) == (node, adapter)]
        if not via:
            raise FabricNotFound(
                404, "ResourceNotFound", f"{device_id} is not reachable from {node}/{adapter}"
            )
        base = f"{ROOT}/Fabrics/{dev.fabric}"
        body = {
            "Links": {
                "InitiatorEndpoints": [{"@odata.id": f"{base}/Endpoints/{via[0].endpoint}"}],
                "TargetEndpoints": [{"@odata.id": f"{base}/Endpoints/{dev.id}"}],
            }
        }
        status, _, data = await self._request("POST", f"{base}/Connections", body)
        if status == 202:
            task = _task(_parse(wire.Task, data, "attach"))
            log.info("fabric attach %s -> %s/%s: task %s", device_id, node, adapter, task.uri)
            return AttachResult(task.connection_uri, task)
        conn = _parse(wire.Connection, data, "attach")
        log.info("fabric attach %s -> %s/%s: already attached", device_id, node, adapter)
        return AttachResult(conn.odata_id, None)

    async def detach(self, device_id: str) -> FabricTask | None:
        """Detach ``device_id`` from wherever it is; None if it is not attached."""
        dev = (await self.inventory()).device(device_id)
        if dev.connection is None:
            return None
        _, _, data = await self._request("DELETE", dev.connection.uri)
        task = _task(_parse(wire.Task, data, "detach"))
        log.info("fabric detach %s from %s: task %s", device_id, dev.connection.node, task.uri)
        return task


# ---- parsing ------------------------------------------------------------------------


def _parse(model: type[wire.M], data: dict[str, Any], where: str) -> wire.M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FabricMalformed(f"fabric answered an unexpected body for {where}: {exc}") from exc


def _api_error(status: int, data: Any) -> FabricApiError:
    try:
        info = wire.ErrorBody.model_validate(data).error
    except ValidationError:
        info = wire.ErrorInfo(code="Base.GeneralError", message=str(data)[:200])
    cls = {409: FabricConflict, 404: FabricNotFound}.get(status, FabricApiError)
    return cls(status, info.code.rsplit(".", 1)[-1], info.message)


def _adapter(fabric: str, e: wire.Endpoint) -> HostAdapter:
    oem = e.patchbay()
    return HostAdapter(e.id, fabric, e.switch(), oem.node, oem.adapter)


def _connection(c: wire.Connection, eps: list[wire.Endpoint]) -> FabricConnection:
    ini = wire.last_segment(c.links.initiators[0].odata_id)
    oem = c.patchbay()
    node = adapter = ""
    for e in eps:
        if e.id == ini:
            node, adapter = e.patchbay().node, e.patchbay().adapter
    return FabricConnection(
        c.id, c.odata_id, wire.last_segment(c.links.targets[0].odata_id), node, adapter,
        oem.state, oem.pci_bus_id, oem.task.odata_id if oem.task else None,
    )  # fmt: skip


def _device(
    fabric: str, e: wire.Endpoint, adapters: list[HostAdapter], conn: FabricConnection | None
) -> FabricDevice:
    oem = e.patchbay()
    pci = e.entities[0].pci_id if e.entities and e.entities[0].pci_id else wire.PciId()
    kind: Literal["gpu", "nic"] = "gpu" if oem.device_type.upper() == "GPU" else "nic"
    sw = e.switch()
    return FabricDevice(
        e.id, fabric, sw, kind, oem.model, oem.serial, oem.uuid,
        int(pci.vendor_id, 16), int(pci.device_id, 16), e.status.health,
        e.status.state != "UnavailableOffline", oem.in_use,
        tuple(a for a in adapters if a.switch == sw), conn, oem.mac.lower(),
    )  # fmt: skip


def _task(t: wire.Task) -> FabricTask:
    oem = t.patchbay()
    return FabricTask(
        t.id, t.odata_id, t.state, oem.operation,
        wire.last_segment(oem.target.odata_id) if oem.target else "",
        oem.connection.odata_id if oem.connection else "",
        tuple(m.message for m in t.messages),
    )  # fmt: skip
