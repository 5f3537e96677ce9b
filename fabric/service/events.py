"""Redfish events of the fabric, streamed as Server-Sent Events.

Why: a fabric manager changes under a client's feet (an attach completes, a
device reports a critical fault, another tenant takes a device). Redfish
publishes such changes through its EventService; a client that subscribes to
``/redfish/v1/EventService/SSE`` learns of them at once instead of polling.
Events here are change notices (``ResourceEvent`` messages naming the
resource in ``OriginOfCondition``); each record carries what the ``Event``
schema requires of its version (``MemberId``, ``MessageId``, and the
deprecated but still required ``EventType``) and ``EventId``; a subscriber
re-reads what it needs, so a slow subscriber that loses events loses nothing but latency: it is
disconnected and re-lists when it reconnects.

Concurrency: :class:`EventBus` lives on the service's asyncio loop;
``publish`` must be called there (never from the store's worker thread). Each
subscriber owns a bounded queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from fabric.service import uris

log = logging.getLogger(__name__)

SSE_URI = uris.SSE
EVENT_TYPE = "#Event.v1_7_0.Event"
QUEUE_SIZE = 256
KEEPALIVE_S = 15.0

CREATED = "ResourceEvent.1.3.ResourceCreated"
REMOVED = "ResourceEvent.1.3.ResourceRemoved"
CHANGED = "ResourceEvent.1.3.ResourceChanged"
TASK_DONE = "TaskEvent.1.0.TaskCompletedOK"
TASK_FAILED = "TaskEvent.1.0.TaskAborted"
# EventType (Event.v1_0_0; deprecated since v1_3_0 but still Required) of each message.
_EVENT_TYPES = {
    CREATED: "ResourceAdded",
    REMOVED: "ResourceRemoved",
    CHANGED: "ResourceUpdated",
    TASK_DONE: "StatusChange",
    TASK_FAILED: "StatusChange",
}


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._next_id = 1

    def subscribe(self) -> asyncio.Queue[dict[str, Any] | None]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(QUEUE_SIZE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        self._subscribers.discard(queue)

    def close(self) -> None:
        """End every stream (service shutdown: open streams must not hold it up)."""
        for queue in list(self._subscribers):
            self._subscribers.discard(queue)
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)

    def publish(self, message_id: str, *origins: str) -> None:
        """One Redfish Event with a record per origin URI, to every subscriber."""
        if not origins:
            return
        ident = str(self._next_id)
        self._next_id += 1
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "@odata.type": EVENT_TYPE,
            "Id": ident,
            "Name": "Fabric event",
            "Events": [
                {
                    "MemberId": str(i),
                    "EventType": _EVENT_TYPES[message_id],
                    "EventId": f"{ident}.{i}",
                    "MessageId": message_id,
                    "EventTimestamp": stamp,
                    "OriginOfCondition": {"@odata.id": uri},
                }
                for i, uri in enumerate(origins)
            ],
        }
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # Too slow: end its stream (None); it re-lists on reconnect.
                log.warning("event subscriber too slow: disconnecting it")
                self._subscribers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)


def event_service() -> dict[str, Any]:
    return {
        "@odata.id": uris.EVENT_SERVICE,
        "@odata.type": "#EventService.v1_10_0.EventService",
        "Id": "EventService",
        "Name": "Event Service",
        "ServiceEnabled": True,
        "ServerSentEventUri": SSE_URI,
    }


async def stream(request: web.Request, bus: EventBus) -> web.StreamResponse:
    """``GET .../SSE``: one ``data:`` line per event, a comment as keep-alive."""
    queue = bus.subscribe()
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    resp = web.StreamResponse(headers=headers)
    try:
        await resp.prepare(request)
        await resp.write(b": subscribed\n\n")
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):  # not wait_for: docs/design.md
                    event = await queue.get()
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
                continue
            if event is None:
                break
            body = json.dumps(event, separators=(",", ":"))
            await resp.write(f"id: {event['Id']}\ndata: {body}\n\n".encode())
    except ConnectionResetError:
        pass
    finally:
        bus.unsubscribe(queue)
    return resp
