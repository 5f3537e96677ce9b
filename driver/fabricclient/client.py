"""An asyncio client of the fabric's Redfish API (aiohttp).

Concurrency: coroutine methods on the caller's loop; one ``aiohttp``
session per client, safe for concurrent calls. Every response body is
validated through ``wire.py`` before use; Redfish error bodies become
:class:`FabricApiError` (409 :class:`FabricConflict`, 404
:class:`FabricNotFound`), transport failures :class:`FabricUnavailable`.

Listing costs one request for the fabrics plus two per fabric (endpoints
and connections, with ``$expand=.``). A device is reachable from every
initiator endpoint on its switch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any, Literal

import aiohttp
from pydantic import ValidationError

from driver.errors import FabricApiError, FabricConflict, FabricNotFound, FabricUnavailable
from driver.fabricclient import wire
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricInventory,
    FabricTask,
    HostAdapter,
)

log = logging.getLogger(__name__)
ROOT = "/redfish/v1"


class FabricClient:
    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

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
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        try:
            async with self._session.request(method, self.base_url + uri, json=body) as resp:
                data = await resp.json(content_type=None) if resp.content_length != 0 else {}
                status, headers = resp.status, dict(resp.headers)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise FabricUnavailable(f"fabric {method} {uri}: {exc}") from exc
        if status >= 400:
            raise _api_error(status, data)
        if not isinstance(data, dict):
            raise FabricUnavailable(f"fabric {method} {uri}: body is not a JSON object")
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
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        uri = f"{ROOT}/EventService/SSE"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout.total, sock_read=idle_timeout_s
        )
        headers = {"Accept": "text/event-stream"}
        try:
            async with self._session.get(
                self.base_url + uri, timeout=timeout, headers=headers
            ) as r:
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
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise FabricUnavailable(f"fabric event stream: {exc}") from exc
        raise FabricUnavailable("fabric event stream ended")

    async def task(self, task_uri: str) -> FabricTask:
        return _task(_parse(wire.Task, await self._get(task_uri), task_uri))

    async def wait(self, task_uri: str, timeout_s: float, interval_s: float = 0.2) -> FabricTask:
        """Poll a task until it is Completed or Exception (TimeoutError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            task = await self.task(task_uri)
            if task.done:
                return task
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fabric task {task_uri} still {task.state}")
            await asyncio.sleep(interval_s)

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
        raise FabricUnavailable(f"fabric answered an unexpected body for {where}: {exc}") from exc


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
