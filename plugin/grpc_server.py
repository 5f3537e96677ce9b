"""The plugin's two gRPC servers on Unix sockets and their lifecycle.

One server listens on the DRA socket and serves ``DRAPlugin``
under v1 and v1beta1 (plus ``DRAResourceHealth`` v1 and v1alpha1 when a
health source is given); a second one listens on the registration socket in the kubelet's
registry directory. The DRA server starts first so that the endpoint the
kubelet learns from ``GetInfo`` already answers; on shutdown the registration
server goes first (the kubelet sees its socket vanish and stops sending new
calls), health streams are ended, in-flight DRA calls get ``grace_s`` seconds
to finish, and then both socket files are removed. The services offered are
read by the kubelet at registration only: to offer the health stream later
(NVML became usable, ``plugin.app``), :meth:`PluginServers.advertise_health`
makes the registration socket anew, which the kubelet's plugin watcher takes
as a new registration (ARCHITECTURE.md section 4).

The servers are our own (``plugin.servers.unix_server`` over
``plugin.servers.h2conn``), not ``grpc.aio``'s: grpc-core's timers and worker
threads wake a process that has a server 6-8 times a second even when no
call ever comes (0.03-0.06 % of a core, over an idle plugin's whole 0.05 %
budget; docs/figures.md), and no grpcio setting stops them; nor grpclib's,
whose HTTP/2 stack cost more CPU per call than the plugin's own work (issue
36). The wire protocol and the servicers are unchanged.

Concurrency model: everything runs on the single asyncio event loop of the
plugin process; servicers are coroutines and the claim handler pushes
blocking work to threads. ``run()`` is meant to be one task of the process's
supervising task group; SIGTERM/SIGINT (or :meth:`PluginServers.request_stop`)
make it shut down gracefully and return.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterable
from pathlib import Path

from driver import DRIVER_NAME
from driver.claims.model import ClaimHandler
from driver.health.model import HealthSource
from plugin.servers.dra import add_dra_servicers
from plugin.servers.health import SERVICE_VERSIONS as HEALTH_VERSIONS
from plugin.servers.health import HealthServicer
from plugin.servers.registration import RegistrationServicer
from plugin.servers.unix_server import UnixGrpcServer
from plugin.sockets import SocketPaths, prepare_for_bind, remove_socket

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PluginServers:
    """The registration and DRA servers of one plugin process. The handler
    serialises prepare/unprepare across both DRA versions (and plugin pods)."""

    def __init__(
        self,
        paths: SocketPaths,
        handler: ClaimHandler,
        health: HealthSource | None = None,
        *,
        driver_name: str = DRIVER_NAME,
        grace_s: float = DEFAULT_GRACE_S,
        advertise_health: bool = True,
    ) -> None:
        self.paths = paths
        self.grace_s = grace_s
        self._handler = handler
        self._health = HealthServicer(health) if health is not None else None
        self._dra_server: UnixGrpcServer | None = None
        self._reg_server: UnixGrpcServer | None = None
        self._stop_requested = asyncio.Event()
        versions = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        if self._health is not None and advertise_health:
            versions.extend(HEALTH_VERSIONS)
        self.registration = RegistrationServicer(driver_name, paths.dra, versions)

    async def start(self) -> None:
        """Bind both sockets (removing stale ones) and start serving."""
        dra = UnixGrpcServer()
        served = add_dra_servicers(dra, self._handler)
        if self._health is not None:
            self._health.add_to(dra)
        await self._bind_and_start(dra, self.paths.dra)
        self._dra_server = dra
        log.info("DRA service (%s) on %s", ", ".join(served), self.paths.dra)

        reg = UnixGrpcServer()
        self.registration.add_to(reg)
        await self._bind_and_start(reg, self.paths.registration)
        self._reg_server = reg
        log.info("registration service on %s", self.paths.registration)

    @property
    def health_advertised(self) -> bool:
        """Whether the kubelet is told about the health stream."""
        return HEALTH_VERSIONS[0] in self.registration.versions

    async def advertise_health(self) -> None:
        """Offer the health stream (served from the start) from now on:
        re-register, since the kubelet reads the versions at registration."""
        if self._health is None or self.health_advertised:
            return
        self.registration.versions = (*self.registration.versions, *HEALTH_VERSIONS)
        old, self._reg_server = self._reg_server, None
        if old is None:
            return  # not started: start() registers with the new versions
        remove_socket(self.paths.registration)
        await old.stop(1.0)
        reg = UnixGrpcServer()
        self.registration.add_to(reg)
        await self._bind_and_start(reg, self.paths.registration)
        self._reg_server = reg
        log.info(
            "re-registering with the kubelet: now serving %s",
            ", ".join(self.registration.versions),
        )

    @staticmethod
    async def _bind_and_start(server: UnixGrpcServer, path: Path) -> None:
        prepare_for_bind(path)
        await server.start(path)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop serving: registration first, then DRA after in-flight calls
        finish (at most ``grace_s``), then remove the socket files."""
        grace = self.grace_s if grace_s is None else grace_s
        try:
            if self._reg_server is not None:
                remove_socket(self.paths.registration)
                await self._reg_server.stop(min(grace, 1.0))
            if self._health is not None:
                self._health.close()
            if self._dra_server is not None:
                log.info("waiting up to %.1fs for in-flight kubelet calls", grace)
                await self._dra_server.stop(grace)
        finally:
            self._reg_server = self._dra_server = None
            remove_socket(self.paths.registration)
            remove_socket(self.paths.dra)
            log.info("gRPC servers stopped, sockets removed")

    def request_stop(self) -> None:
        """Make :meth:`run` shut down as if it had received SIGTERM."""
        self._stop_requested.set()

    async def run(self, stop_signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        """Start, serve until a stop signal or :meth:`request_stop`, stop.

        Cancelling the task also stops the servers gracefully before the
        cancellation propagates.
        """
        loop = asyncio.get_running_loop()
        installed = []
        for sig in stop_signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
            installed.append(sig)
        try:
            await self.start()
            await self._stop_requested.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s; shutting down gracefully", sig.name)
        self._stop_requested.set()
