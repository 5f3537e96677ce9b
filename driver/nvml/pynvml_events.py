"""XID events from the real NVML: an event set over ``pynvml``.

The health monitor waits on it in a thread of its own; kept apart from
:mod:`driver.nvml.pynvml_backend` (discovery and MIG calls), whose
``watch_events`` makes one. Errors count like the backend's
(``counts_errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.backend import XID_FALLEN_OFF_BUS, NvmlReturn, XidEvent, counts_errors
from driver.nvml.pynvml_library import call


@counts_errors
class PynvmlEventWatcher:
    """XID events through an NVML event set.

    A watched GPU that is lost makes NVML's wait fail with GPU_IS_LOST; we
    report it once as XID 79 (fallen off the bus) and rebuild the event set
    without it, so the other GPUs stay watched.
    """

    def __init__(self, handle: Callable[[str], Any], uuids: list[str]) -> None:
        self._handle = handle  # the backend's GPU handle by UUID
        self._uuids = uuids
        self._set: Any = None
        self._build()

    def _build(self) -> None:
        if self._set is not None:
            call(pynvml.nvmlEventSetFree, self._set)
        self._set = call(pynvml.nvmlEventSetCreate)
        for uuid in self._uuids:
            h = self._handle(uuid)
            call(
                pynvml.nvmlDeviceRegisterEvents, h, pynvml.nvmlEventTypeXidCriticalError, self._set
            )

    def _lost(self) -> list[XidEvent]:
        lost = []
        for uuid in self._uuids:
            try:
                call(pynvml.nvmlDeviceGetUUID, self._handle(uuid))
            except NvmlError as exc:
                if exc.code != NvmlReturn.GPU_IS_LOST:
                    raise
                lost.append(XidEvent(uuid, XID_FALLEN_OFF_BUS))
        gone = {e.uuid for e in lost}
        self._uuids = [u for u in self._uuids if u not in gone]
        self._build()
        return lost

    def wait(self, timeout_ms: int) -> list[XidEvent]:
        events: list[XidEvent] = []
        while True:
            try:
                data = call(pynvml.nvmlEventSetWait_v2, self._set, 0 if events else timeout_ms)
            except NvmlError as exc:
                if exc.code == NvmlReturn.TIMEOUT:
                    return events
                if exc.code == NvmlReturn.GPU_IS_LOST:
                    return events + self._lost()
                raise
            uuid = call(pynvml.nvmlDeviceGetUUID, data.device)
            events.append(XidEvent(uuid, int(data.eventData)))

    def close(self) -> None:
        if self._set is not None:
            call(pynvml.nvmlEventSetFree, self._set)
            self._set = None
