"""The typed model of device health reported to the kubelet.

The kubelet's DRAResourceHealth stream (KEP-4680) wants, every time anything
changes, the complete list of the driver's devices with their health. A
health monitor in ``driver`` produces those lists as :class:`DeviceHealth`
values through the :class:`HealthSource` protocol; the gRPC layer in
``plugin/`` turns them into protobuf, so nothing here knows about gRPC.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class HealthStatus(enum.Enum):
    """A device's health as the kubelet understands it."""

    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class DeviceHealth:
    """The health of one device of one of our pools.

    ``last_updated`` is the Unix time in seconds when the status was
    determined; ``check_timeout_s`` tells the kubelet how long to wait for the
    next report before it treats the device as unknown (0: kubelet default).
    """

    pool_name: str
    device_name: str
    status: HealthStatus
    last_updated: int
    check_timeout_s: int = 0
    message: str = ""


class HealthSource(Protocol):
    """Produces the complete health list of the driver's devices.

    ``updates()`` yields the current list first and then a new complete list
    every time any device's health changes. Each kubelet stream calls it
    afresh, so an implementation must support several concurrent iterators
    (typically by keeping the latest list and a change notification). The
    iterator ends only when the source shuts down.
    """

    def updates(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        """Iterate over complete health lists, current one first."""
        ...
