"""The kubelet's device health stream (``DRAResourceHealth``, v1 and v1alpha1).

``NodeWatchResources`` is a server-streaming call the kubelet keeps open: we
send the complete list of our devices' health first and again every time it
changes (KEP-4680). The lists come from a
:class:`~driver.health.model.HealthSource`; this module translates them,
skips a list identical to the one just sent, and re-sends the last list when
a third of its lease has gone by without a change: the kubelet stamps each
device's health with the time it received it and reads it as ``Unknown``
once the device's ``health_check_timeout_seconds`` (0: the kubelet's
``DefaultHealthTimeout``, 30 s, ``pkg/kubelet/cm/dra/healthinfo.go``) has
passed without a report, so a list sent only on change would show every
device ``Unknown`` in pod status half a minute later. The re-send runs on
the server's loop: a plugin whose loop is wedged stops renewing the lease
and its devices decay to ``Unknown``, as the kubelet intends.

One implementation, two gRPC services: the 1.37 kubelet opens the first of
``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` that a plugin
advertises (v1alpha1 goes away in 1.40), older kubelets know only v1alpha1.
The two protos are field-for-field equal and differ only in their package, so
one :class:`HealthServicer` serves both; a :class:`HealthApi` names the
generated modules of one version. Each stream logs the version the kubelet
opened, which the node tier reads to see which one the real kubelet chose.

Concurrency model: one async generator per open stream on the server's
asyncio loop. :meth:`HealthServicer.close` ends every open stream promptly
so a graceful shutdown is not held up for the whole grace period by streams
that never finish on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from driver.health.model import DeviceHealth, HealthSource, HealthStatus
from plugin.proto import health_v1_pb2, health_v1alpha1_pb2
from plugin.servers.unix_server import UnixGrpcServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthApi:
    """One wire version of the health service: its registration name and the
    generated messages module (read as untyped)."""

    version: str
    pb2: Any


V1 = HealthApi("v1.DRAResourceHealth", health_v1_pb2)
V1ALPHA1 = HealthApi("v1alpha1.DRAResourceHealth", health_v1alpha1_pb2)
# Newest first, the order the kubelet prefers them in.
HEALTH_APIS = (V1, V1ALPHA1)
SERVICE_VERSIONS = tuple(api.version for api in HEALTH_APIS)
# The kubelet's lease on a device's health when the plugin names none
# (health_check_timeout_seconds 0): DefaultHealthTimeout of the 1.37 kubelet.
KUBELET_DEFAULT_LEASE_S = 30
# Re-send the last list after this share of its shortest lease: twice more
# before it lapses, so one late turn of the loop does not cost it.
RESEND_FRACTION = 1 / 3


def resend_after(devices: Sequence[DeviceHealth]) -> float:
    """Seconds after which an unchanged list is sent again, before the
    kubelet's lease on its shortest-lived device lapses."""
    leases = [d.check_timeout_s if d.check_timeout_s > 0 else KUBELET_DEFAULT_LEASE_S
              for d in devices]  # fmt: skip
    return min(leases, default=KUBELET_DEFAULT_LEASE_S) * RESEND_FRACTION


def health_to_proto(devices: Iterable[DeviceHealth], api: HealthApi = V1) -> Any:
    """One complete list as ``NodeWatchResourcesResponse`` of ``api``'s version."""
    pb2 = api.pb2
    status = {
        HealthStatus.UNKNOWN: pb2.UNKNOWN,
        HealthStatus.HEALTHY: pb2.HEALTHY,
        HealthStatus.UNHEALTHY: pb2.UNHEALTHY,
    }
    return pb2.NodeWatchResourcesResponse(
        devices=[
            pb2.DeviceHealth(
                device=pb2.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                health=status[d.status],
                last_updated_time=d.last_updated,
                health_check_timeout_seconds=d.check_timeout_s,
                message=d.message,
            )
            for d in devices
        ]
    )


class _VersionedServicer:
    """The gRPC-facing servicer of one version; delegates to the shared one."""

    def __init__(self, shared: HealthServicer, api: HealthApi) -> None:
        self._shared = shared
        self._api = api

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        # The server iterates what this returns: an async generator function.
        async with contextlib.aclosing(self._shared.watch(self._api)) as stream:
            async for message in stream:
                yield message


class HealthServicer:
    """Implements ``DRAResourceHealth`` (every version) on a :class:`HealthSource`."""

    def __init__(self, source: HealthSource) -> None:
        self._source = source
        self._closed = asyncio.Event()

    def close(self) -> None:
        """End every open stream (and refuse new ones) before server shutdown."""
        self._closed.set()

    async def watch(self, api: HealthApi) -> AsyncGenerator[Any]:
        """One open stream: the complete list first, then each change, and the
        last list again before the kubelet's lease on it lapses."""
        log.info("kubelet opened a health stream (%s)", api.version)
        loop = asyncio.get_running_loop()
        updates = aiter(self._source.updates())
        last: Sequence[DeviceHealth] | None = None
        due: float | None = None  # loop time of the next re-send of ``last``
        closed = asyncio.ensure_future(self._closed.wait())
        nxt: asyncio.Future[Sequence[DeviceHealth]] | None = None
        try:
            while not self._closed.is_set():
                if nxt is None:
                    nxt = asyncio.ensure_future(anext(updates))
                wait = None if due is None else max(0.0, due - loop.time())
                watched: set[asyncio.Future[Any]] = {nxt, closed}
                await asyncio.wait(watched, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if self._closed.is_set():
                    break
                if not nxt.done():  # no change within the lease: renew it
                    assert last is not None  # due is set only once a list went out
                    due = loop.time() + resend_after(last)
                    yield health_to_proto(last, api)
                    continue
                done, nxt = nxt, None
                try:
                    devices = list(done.result())
                except StopAsyncIteration:
                    log.info("health source ended; closing the stream")
                    break
                if devices != last:
                    last = devices
                    due = loop.time() + resend_after(devices)
                    yield health_to_proto(devices, api)
        finally:
            closed.cancel()
            if nxt is not None and not nxt.done():
                nxt.cancel()
                await asyncio.wait({nxt})
            aclose = getattr(updates, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            log.info("health stream closed (%s)", api.version)

    def add_to(self, server: UnixGrpcServer) -> None:
        """Register every version's service on ``server``."""
        for api in HEALTH_APIS:
            service = api.pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
            server.add_service(service, _VersionedServicer(self, api))
