"""What patchbay asks of the Kubernetes API: the :class:`KubeClient` protocol.

Every user of the API (the slice publisher, the list+watch cache, the
claim reader, the controller's status writer and lease, the node's fabric
report) is typed against this protocol, not the client. Two
implementations ship: :class:`driver.kube.api.KubeApi` (the apiserver,
through our own configuration and HTTP/1.1 client) and
:class:`driver.kube.memory.MemoryKube` (in memory, for tests and
benchmarks, like the NVML fake). Paths are the apiserver's REST paths;
bodies and answers are its JSON objects; failures raise
:class:`driver.errors.ApiStatusError` (an HTTP status) or
:class:`driver.errors.ApiError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

JsonObj = dict[str, Any]


class KubeClient(Protocol):
    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> JsonObj:
        """One object, or a list (``items``, ``metadata.resourceVersion``)."""
        ...

    async def create(self, path: str, body: JsonObj) -> JsonObj: ...
    async def replace(self, path: str, body: JsonObj) -> JsonObj: ...
    async def merge_patch(self, path: str, body: JsonObj) -> JsonObj: ...
    async def apply(
        self, path: str, body: JsonObj, field_manager: str, force: bool = False
    ) -> JsonObj:
        """Server-side apply of ``body`` (JSON is YAML) as ``field_manager``;
        ``force`` takes the fields it names from other managers."""
        ...

    async def delete(self, path: str, body: JsonObj | None = None) -> JsonObj: ...

    def watch(
        self, path: str, query: Mapping[str, Any], timeout_seconds: int = 300
    ) -> AsyncIterator[JsonObj]:
        """Watch events (``{"type": ..., "object": ...}``) from
        ``query["resourceVersion"]`` until the server ends the watch."""
        ...
