"""The kubelet plugin registration service (``pluginregistration.Registration``).

The kubelet's plugin watcher finds our socket in its registry directory, asks
``GetInfo`` (within 1 s) for the plugin type, name, DRA endpoint and the
service versions we serve, then reports the outcome through
``NotifyRegistrationStatus``. The outcome is kept here for the process to wait
on (:attr:`RegistrationServicer.registered`) and logged when it failed.

Concurrency model: coroutine methods on the server's asyncio loop; the state
is only touched from that loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugin.proto import registration_pb2
from plugin.servers.unix_server import UnixGrpcServer

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet told us last."""

    registered: bool
    error: str


class RegistrationServicer:
    """Answers ``GetInfo`` and records ``NotifyRegistrationStatus``.

    ``registered`` is set while the kubelet reports us registered and cleared
    when it reports a failure; ``notified`` is set by any report; ``status``
    holds the latest report (``None`` before the first).
    """

    def __init__(self, driver_name: str, endpoint: Path, versions: Sequence[str]) -> None:
        if not endpoint.is_absolute():
            raise ValueError(f"the DRA endpoint must be an absolute path, got {endpoint}")
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.versions = tuple(versions)
        self.registered = asyncio.Event()
        self.notified = asyncio.Event()
        self.status: RegistrationStatus | None = None

    async def GetInfo(self, request: Any, context: Any) -> Any:
        log.debug("GetInfo from the kubelet")
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.endpoint),
            supported_versions=list(self.versions),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.status = RegistrationStatus(registered=request.plugin_registered, error=request.error)
        if request.plugin_registered:
            log.info("registered with the kubelet as %s at %s", self.driver_name, self.endpoint)
            self.registered.set()
        else:
            log.error("the kubelet refused to register %s: %s", self.driver_name, request.error)
            self.registered.clear()
        self.notified.set()
        return registration_pb2.RegistrationStatusResponse()

    def add_to(self, server: UnixGrpcServer) -> None:
        """Register this servicer on ``server``."""
        server.add_service(registration_pb2.DESCRIPTOR.services_by_name["Registration"], self)
