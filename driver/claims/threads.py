"""Which claims the preparer runs in a worker thread, and which on the event loop.

Why a module: a claim whose handlers only compute CDI edits is prepared on
the event loop (a thread hop costs more than the work); one that may block
(NVML, sysfs rebinds, a lock scans share, GPU sharing's subprocesses) goes
to a worker thread so the loop keeps serving. The answer depends on the
devices' handlers and on what the claim asks (a GPU blocks only when its
config asks for passthrough: ``driver.devices.handler.blocks_prepare``) or
what its record holds to undo (``blocks_unprepare``). An unknown device kind
goes to the thread, where it fails with its error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from driver.checkpoint import ClaimRecord
from driver.devices.handler import (
    ClaimSharing,
    DeviceHandler,
    blocks_prepare,
    blocks_unprepare,
)

SHARING_KEY = "sharing"  # a config asking for GPU sharing (driver.gpu.sharing)


class ThreadChoice:
    def __init__(self, handlers: Mapping[str, DeviceHandler], sharing: ClaimSharing | None) -> None:
        self._handlers = handlers
        self._sharing = sharing

    def shares(self, record: ClaimRecord) -> bool:
        """Whether GPU sharing is involved in ``record``'s devices."""
        return self._sharing is not None and self._sharing.involved(
            [d.undo for d in record.devices]
        )

    def for_prepare(
        self,
        kinds: Sequence[str],
        parameters: Sequence[Mapping[str, Any]],
        record: ClaimRecord | None,
    ) -> bool:
        """Whether preparing a claim of devices of ``kinds`` with these raw
        config parameters (undoing its interrupted ``record`` first) may block."""
        if self._sharing is not None and any(SHARING_KEY in p for p in parameters):
            return True
        if any(k not in self._handlers or blocks_prepare(self._handlers[k], parameters)
               for k in kinds):  # fmt: skip
            return True
        return record is not None and self.for_undo(record)

    def for_undo(self, record: ClaimRecord) -> bool:
        """Whether undoing ``record`` may block."""
        return self.shares(record) or any(
            d.kind not in self._handlers or blocks_unprepare(self._handlers[d.kind], d.undo)
            for d in record.devices
        )
