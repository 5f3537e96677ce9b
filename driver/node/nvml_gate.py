"""GPUs offered only while NVML works: a host without the NVIDIA driver still gets a plugin.

Why this module exists: a NIC-only node, a GPU-less node waiting for
fabric GPUs, or a GPU node whose driver is not installed (or not loaded)
yet has no usable NVML: ``nvmlInit`` fails with ``LIBRARY_NOT_FOUND`` or
``DRIVER_NOT_LOADED``. Such a node must still publish its VFs and fabric
adapters, so :class:`NvmlGate` wraps the GPU device type: while NVML cannot
be initialised a scan yields no GPUs and keeps the reason (for the log and
``/healthz``); the next scan that succeeds offers them again.
:func:`retry_while_unavailable` is the plugin task that rescans with backoff
until then (a driver install brings no PCI uevent). With ``required`` the
error propagates instead (``--nvml-required``: the process exits with the
discovery exit code, the old behaviour). docs/design.md "Hostile hosts".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping

from driver.backoff import Backoff
from driver.devices.handler import DeviceHandler
from driver.devices.kind import DeviceType, Discovery
from driver.errors import NvmlError
from driver.nvml.backend import NvmlReturn

log = logging.getLogger(__name__)

LIB_RM_VERSION_MISMATCH = 18  # library and kernel module of different driver versions
UNAVAILABLE = frozenset(
    {
        NvmlReturn.LIBRARY_NOT_FOUND,
        NvmlReturn.DRIVER_NOT_LOADED,
        NvmlReturn.NO_PERMISSION,  # /dev/nvidiactl not accessible to the plugin
        LIB_RM_VERSION_MISMATCH,
    }
)
"""The NVML codes that mean "no usable NVML on this host", not a GPU fault."""

RETRY_BACKOFF_S = (1.0, 60.0)  # first retry, longest wait between retries


class NvmlGate:
    """A GPU :class:`DeviceType` whose scans survive a host without NVML."""

    def __init__(self, inner: DeviceType, *, required: bool = False) -> None:
        self.inner = inner
        self.required = required
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._ever_available = False
        self._listeners: list[Callable[[], None]] = []

    def on_unavailable(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from the scanning thread) when NVML goes away."""
        self._listeners.append(listener)

    @property
    def reason(self) -> str | None:
        """Why GPUs are not offered now; None while NVML works."""
        return self._reason

    @property
    def ever_available(self) -> bool:
        """Whether a scan has reached NVML since the process started."""
        return self._ever_available

    def discover(self) -> Discovery:
        try:
            found = self.inner.discover()
        except NvmlError as exc:
            if self.required or exc.code not in UNAVAILABLE:
                raise
            self._unavailable(str(exc))
            return Discovery()
        with self._lock:
            was, self._reason, self._ever_available = self._reason, None, True
        if was is not None:
            log.info("NVML available: GPUs are offered again (was: %s)", was)
        return found

    def _unavailable(self, reason: str) -> None:
        with self._lock:
            was, self._reason = self._reason, reason
        if was is None:
            for listener in self._listeners:
                listener()
        if was != reason:
            log.warning(
                "GPUs not offered: %s; the plugin serves the node's other devices and "
                "retries NVML (set --nvml-required to exit instead)",
                reason,
            )

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return self.inner.handlers()


async def retry_while_unavailable(
    gates: list[NvmlGate], rescan: Callable[[], Awaitable[None]]
) -> None:
    """Rescan with backoff while a gate has no NVML; runs until cancelled.

    While NVML works it sleeps until a gate reports NVML gone (no timer:
    an idle plugin does not wake up for it)."""
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()

    def notify() -> None:  # from a scan's worker thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(gone.set)

    for gate in gates:
        gate.on_unavailable(notify)
    backoff = Backoff(*RETRY_BACKOFF_S)
    while True:
        if not any(g.reason for g in gates):
            backoff.reset()
            gone.clear()
            if not any(g.reason for g in gates):  # not gone between the check and clear
                await gone.wait()
            continue
        delay = backoff.next()
        log.debug("NVML unavailable; next try in %.0fs", delay)
        await asyncio.sleep(delay)
        await rescan()
