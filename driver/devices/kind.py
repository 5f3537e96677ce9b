"""A device type as the node plugin sees it: how to find its devices and
how to prepare them.

Each device family (full GPUs, MIG partitions, SR-IOV VFs) provides one
:class:`DeviceType`. The plugin scans every type into one node pool and
routes each prepared device to the handler of its ``Device.kind``. Adding a
family means adding a type, not editing the plugin.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from driver.backoff import Backoff
from driver.devices.handler import DeviceHandler
from driver.devices.model import CounterSet, Device

log = logging.getLogger(__name__)

# A scan that meets a device changing under it is run again (scan_settled).
SCAN_TRIES = 5
SCAN_RETRY_S, SCAN_RETRY_CAP_S, SCAN_RETRY_JITTER = 0.05, 1.0, 0.5


@dataclass(frozen=True)
class Discovery:
    """What one scan found: devices in preference order, and counter sets."""

    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = field(default_factory=tuple)

    def __add__(self, other: Discovery) -> Discovery:
        return Discovery(self.devices + other.devices, self.counter_sets + other.counter_sets)


class DeviceType(Protocol):
    def discover(self) -> Discovery:
        """Enumerate this family's devices now (blocking; runs in a thread)."""
        ...

    def handlers(self) -> Mapping[str, DeviceHandler]:
        """The handler for each ``Device.kind`` this family publishes."""
        ...


def scan_all(types: Sequence[DeviceType]) -> Discovery:
    """One node-wide scan, families in the given order."""
    result = Discovery()
    for device_type in types:
        result = result + device_type.discover()
    return result


async def scan_settled(types: Sequence[DeviceType], backoff: Backoff | None = None) -> Discovery:
    """:func:`scan_all` in a worker thread, run again when a device changed under it.

    A function removed between two sysfs reads of one scan (a hot-remove, VFs
    going to zero) raises OSError from the middle of a family's enumeration:
    a real kernel takes no lock a reader could share. Such a scan is run
    again after a short jittered wait, up to ``SCAN_TRIES`` times; the
    hot-plug event that follows the change settles what the last one found.
    Past that the error stands (the hot-plug watch ends, the process restarts)."""
    backoff = backoff or Backoff(SCAN_RETRY_S, SCAN_RETRY_CAP_S, SCAN_RETRY_JITTER)
    tried = 0
    while True:
        tried += 1
        try:
            return await asyncio.to_thread(scan_all, types)
        except OSError as exc:
            if tried >= SCAN_TRIES:
                raise
            delay = backoff.next()
            log.warning("a device changed under the scan (%s): scanning again in %.2fs",
                        exc, delay)  # fmt: skip
            await asyncio.sleep(delay)


def all_handlers(types: Sequence[DeviceType]) -> dict[str, DeviceHandler]:
    handlers: dict[str, DeviceHandler] = {}
    for device_type in types:
        handlers.update(device_type.handlers())
    return handlers
