"""A device type as the node plugin sees it: how to find its devices and
how to prepare them.

Each device family (full GPUs, MIG partitions, SR-IOV VFs) provides one
:class:`DeviceType`. The plugin scans every type into one node pool and
routes each prepared device to the handler of its ``Device.kind``. Adding a
family means adding a type, not editing the plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from driver.devices.handler import DeviceHandler
from driver.devices.model import CounterSet, Device


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


def all_handlers(types: Sequence[DeviceType]) -> dict[str, DeviceHandler]:
    handlers: dict[str, DeviceHandler] = {}
    for device_type in types:
        handlers.update(device_type.handlers())
    return handlers
