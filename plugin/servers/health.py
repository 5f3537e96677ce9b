"""The kubelet's device health stream (``v1alpha1.DRAResourceHealth``).

``NodeWatchResources`` is a server-streaming call the kubelet keeps open: we
send the complete list of our devices' health first and again every time it
changes (KEP-4680). The lists come from a
:class:`~driver.health.model.HealthSource`; this module only translates them
and skips a list identical to the one just sent.

Concurrency model: one async generator per open stream on the server's
asyncio loop. :meth:`HealthServicer.close` ends every open stream promptly
so a graceful shutdown is not held up for the whole grace period by streams
that never finish on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from driver.health.model import DeviceHealth, HealthSource, HealthStatus
from plugin.proto import health_v1alpha1_pb2 as pb2
from plugin.proto import health_v1alpha1_pb2_grpc as pb2_grpc

log = logging.getLogger(__name__)

# The generated *_pb2_grpc modules have no type stubs; treat them as untyped.
_grpc: Any = pb2_grpc

SERVICE_VERSION = "v1alpha1.DRAResourceHealth"

_STATUS = {
    HealthStatus.UNKNOWN: pb2.UNKNOWN,
    HealthStatus.HEALTHY: pb2.HEALTHY,
    HealthStatus.UNHEALTHY: pb2.UNHEALTHY,
}


def health_to_proto(devices: Iterable[DeviceHealth]) -> Any:
    """One complete list as ``NodeWatchResourcesResponse``."""
    return pb2.NodeWatchResourcesResponse(
        devices=[
            pb2.DeviceHealth(
                device=pb2.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                health=_STATUS[d.status],
                last_updated_time=d.last_updated,
                health_check_timeout_seconds=d.check_timeout_s,
                message=d.message,
            )
            for d in devices
        ]
    )


class HealthServicer:
    """Implements ``DRAResourceHealth`` on top of a :class:`HealthSource`."""

    def __init__(self, source: HealthSource) -> None:
        self._source = source
        self._closed = asyncio.Event()

    def close(self) -> None:
        """End every open stream (and refuse new ones) before server shutdown."""
        self._closed.set()

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        log.info("kubelet opened a health stream")
        updates = aiter(self._source.updates())
        last: Sequence[DeviceHealth] | None = None
        closed = asyncio.ensure_future(self._closed.wait())
        nxt: asyncio.Future[Sequence[DeviceHealth]] | None = None
        try:
            while not self._closed.is_set():
                nxt = asyncio.ensure_future(anext(updates))
                await asyncio.wait({nxt, closed}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    break
                try:
                    devices = list(nxt.result())
                except StopAsyncIteration:
                    log.info("health source ended; closing the stream")
                    break
                if devices != last:
                    last = devices
                    yield health_to_proto(devices)
        finally:
            closed.cancel()
            if nxt is not None and not nxt.done():
                nxt.cancel()
                await asyncio.wait({nxt})
            aclose = getattr(updates, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            log.info("health stream closed")

    def add_to(self, server: Any) -> None:
        """Register this servicer on a ``grpc.aio.Server``."""
        _grpc.add_DRAResourceHealthServicer_to_server(self, server)
