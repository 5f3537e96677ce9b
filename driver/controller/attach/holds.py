"""Fabric devices kept out of the pool for a while after a failed attach.

Why: a device whose attach was refused or failed (4xx, foreign tenant,
task failed, timeout; not an unreachable fabric or a broken resource:
``driver.controller.attach.cases``)
would otherwise be offered again at once and fail the next claim the same
way. It stays out of the published pool for ``--failed-device-hold``
seconds. The reconciler asks which devices are held when it builds the
pool and drops expired holds; the attach workers add them. Nothing else
wakes the reconciler when a hold ends, so a hold schedules that wake-up
itself. A device its node found failed (``driver.controller.health``) is
held too, for as long as that failure lasts: no attach starts for it.

Concurrency: used on the controller's asyncio loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class FailedHolds:
    """Device id -> the monotonic time its hold ends."""

    def __init__(self, hold_s: float, on_expiry: Callable[[], None]) -> None:
        self._hold_s = hold_s
        self._on_expiry = on_expiry
        self._until: dict[str, float] = {}
        # Device id -> why it failed on a node and is held out (None: it did not;
        # the reconciler's driver.controller.health.failures), never attached.
        self.failed: Callable[[str], str | None] = lambda _device_id: None

    @property
    def seconds(self) -> float:
        """How long a hold lasts (``--failed-device-hold``)."""
        return self._hold_s

    def hold(self, device_id: str) -> None:
        """Keep ``device_id`` out of the pool for the hold time from now (not
        one that failed on a node: its failure holds it, in the pool)."""
        if self.failed(device_id) is not None:
            return
        self._until[device_id] = time.monotonic() + self._hold_s
        # A pass when the hold ends brings the device back (nothing else may mark us).
        asyncio.get_running_loop().call_later(self._hold_s + 0.1, self._on_expiry)

    def __contains__(self, device_id: object) -> bool:
        """Whether no attach may start for ``device_id``: held after a failed
        attach, or failed on a node (:attr:`failed`)."""
        return device_id in self._until or (
            isinstance(device_id, str) and self.failed(device_id) is not None
        )

    def why(self, device_id: str) -> str:
        """Why :meth:`__contains__` says so (an attach that fails names it)."""
        return self.failed(device_id) or f"{device_id} is held after a failed attach"

    def expire(self) -> None:
        """Forget the holds that have ended."""
        now = time.monotonic()
        for device_id, until in list(self._until.items()):
            if until <= now:
                log.info("fabric device %s back in the pool after its failure hold", device_id)
                del self._until[device_id]

    def held(self) -> set[str]:
        """The ids of the devices held now (as of the last :meth:`expire`)."""
        return set(self._until)
