"""The ``connections`` dialect: DMTF ``Fabric/Connections`` (POST to attach, DELETE to detach).

Why a module: this is DMTF's own way (the CXL and NVMe-oF mockups use it)
and our default. An attach POSTs a Connection naming the initiator and
target endpoints; CXL memory is a ``ConnectionType: Memory`` connection
whose ``MemoryChunkInfo`` names the logical device's memory chunks (from
the endpoint's ``MemoryChunk`` entities, else the CXLLogicalDevice's
``Links.MemoryChunks``). A connection's ``Status`` is its progress
(:func:`state_of`, the zones dialect reads it too): ``State`` ``Starting``
attaching, ``Disabled`` detaching, ``UnavailableOffline`` (present, not
usable) or else ``Health`` ``Critical`` failed, anything else attached.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from driver.fabricclient import wire
from driver.fabricclient.dialect import IDEMPOTENCY_HEADER, link
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import (
    AttachResult,
    ConnectionState,
    FabricConnection,
    FabricDevice,
    FabricTask,
    HostAdapter,
)
from driver.fabricclient.operations import Operations

log = logging.getLogger(__name__)
STATES: dict[str | None, ConnectionState] = {
    "Starting": "Attaching",
    "Disabled": "Detaching",
    "UnavailableOffline": "Failed",
}


def state_of(status: wire.Status) -> ConnectionState:
    """A connection's progress from its ``Status`` (see the module docstring)."""
    state = STATES.get(status.state)
    if state is None:
        state = "Failed" if status.health == "Critical" else "Attached"
    return state


def connection(
    c: wire.Connection, initiators: Mapping[str, HostAdapter]
) -> FabricConnection | None:
    """Our view of a device connection; None for one that names no target endpoint
    (an NVMe-oF Storage connection names volumes instead)."""
    if not c.links.targets:
        return None
    ini = initiators.get(c.links.initiators[0].odata_id.rstrip("/")) if c.links.initiators else None
    return FabricConnection(
        c.id, c.odata_id, wire.last_segment(c.links.targets[0].odata_id),
        ini.node if ini else "", ini.adapter if ini else "",
        state_of(c.status), "", None,
    )  # fmt: skip


async def memory_chunks(links: Links, dev: FabricDevice) -> list[str]:
    ep = await links.model(wire.Endpoint, dev.endpoint_uri())
    chunks = [e.link.odata_id for e in ep.entities if e.type == "MemoryChunk" and e.link]
    for e in ep.entities:
        if not chunks and e.type == "CXLDevice" and e.link is not None:
            ld = await links.model(wire.Device, e.link.odata_id)
            chunks = [c.odata_id for c in ld.links.memory_chunks]
    return chunks


class ConnectionsDialect:
    name = "connections"
    picks_devices = False  # it attaches the device it is asked for

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        return None  # a system names its node (HostName, a mapping or a systemUUID)

    async def connections(
        self, links: Links, fabric: wire.Fabric, initiators: Mapping[str, HostAdapter]
    ) -> list[FabricConnection]:
        if fabric.connections is None:
            return []
        where = fabric.connections.odata_id
        bodies = [parse(wire.Connection, b, where) for b in await links.members(where)]
        return [c for c in (connection(b, initiators) for b in bodies) if c is not None]

    async def attach(
        self, ops: Operations, links: Links, dev: FabricDevice, via: HostAdapter, key: str
    ) -> AttachResult:
        body: dict[str, Any] = {
            "Links": {
                "InitiatorEndpoints": [link(via.endpoint_uri())],
                "TargetEndpoints": [link(dev.endpoint_uri())],
            }
        }
        if dev.kind == "cxlmem":
            chunks = await memory_chunks(links, dev)
            body["ConnectionType"] = "Memory"
            body["MemoryChunkInfo"] = [
                {"AccessCapabilities": ["Read", "Write"], "MemoryChunk": link(c)} for c in chunks
            ]
        uri = f"/redfish/v1/Fabrics/{dev.fabric}/Connections"
        _, task = await ops.submit("POST", uri, body, {IDEMPOTENCY_HEADER: key}, "attach", dev.id)
        if task.done:
            log.info("fabric attach %s -> %s/%s: done", dev.id, via.node, via.adapter)
            return AttachResult(task.connection_uri, None)
        # The connection the target endpoint links now (Links.Connections), read afresh.
        ep = await Links(links.transport).model(wire.Endpoint, dev.endpoint_uri())
        conn = ep.links.connections[0].odata_id if ep.links.connections else ""
        log.info("fabric attach %s -> %s/%s: task %s", dev.id, via.node, via.adapter, task.uri)
        return AttachResult(conn, task)

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        assert dev.connection is not None
        _, task = await ops.submit("DELETE", dev.connection.uri, None, {}, "detach", dev.id)
        log.info("fabric detach %s from %s: %s", dev.id, dev.connection.node, task.uri)
        return task
