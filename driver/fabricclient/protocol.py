"""What the controller asks of the fabric: the :class:`FabricApi` protocol.

Two implementations ship: :class:`driver.fabricclient.client.FabricClient`
(the Redfish-shaped service over HTTP) and
:class:`driver.fabricclient.memory.MemoryFabric` (in memory, for tests and
benchmarks). Failures raise the fabric errors of :mod:`driver.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol

from driver.fabricclient.model import AttachResult, FabricDevice, FabricInventory, FabricTask


class FabricApi(Protocol):
    @property
    def picks_devices(self) -> bool:
        """Whether the manager picks which device of a model it attaches (a
        count-based manager): the controller's pool then offers model slots."""
        ...

    async def inventory(self) -> FabricInventory: ...
    def set_node_uuids(self, uuids: Mapping[str, str]) -> None:
        """The Nodes' ``systemUUID``s (unique ones), to name a system's node by."""
        ...

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """The cluster's Nodes as listed, on every controller pass (a count-based
        manager's machine id may be a Node label or annotation)."""
        ...

    async def device(self, device_id: str) -> FabricDevice: ...

    def events(self, idle_timeout_s: float = 60.0) -> AsyncIterator[list[str]]:
        """``[]`` once subscribed, then the origin URIs of each event."""
        ...

    async def attach(self, device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
        """``key``: the caller's allocation, part of the request's Idempotency-Key."""
        ...

    async def detach(self, device_id: str) -> FabricTask | None: ...
    async def task(self, task_uri: str) -> FabricTask:
        """One look at an operation handle (a Task or a DSP0266 task monitor)."""
        ...

    async def wait(
        self, task_uri: str, timeout_s: float, interval_s: float = 0.2
    ) -> FabricTask: ...
