"""The health stream renews the kubelet's lease on an unchanged list.

The 1.37 kubelet stamps each device's health with the time it received it
and reads it as ``Unknown`` once the device's lease has passed without a
report (``pkg/kubelet/cm/dra/healthinfo.go``), so the stream sends the last
list again before then, even when nothing changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from driver.health.model import DeviceHealth, HealthStatus
from plugin.servers.health import (
    KUBELET_DEFAULT_LEASE_S,
    V1,
    HealthServicer,
    resend_after,
)


class OnceHealth:
    """A source that yields one list, then nothing (no device ever changes)."""

    def __init__(self, devices: list[DeviceHealth]) -> None:
        self.devices = devices
        self.forever = asyncio.Event()

    async def updates(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        yield self.devices
        await self.forever.wait()


def gpu(name: str, lease_s: int = 0) -> DeviceHealth:
    return DeviceHealth("node-a", name, HealthStatus.HEALTHY, 100, lease_s)


async def test_an_unchanged_list_is_sent_again_within_its_lease() -> None:
    source = OnceHealth([gpu("gpu-0", lease_s=1), gpu("gpu-1")])
    servicer = HealthServicer(source)
    async with contextlib.aclosing(servicer.watch(V1)) as stream:
        async with asyncio.timeout(5):
            first = await anext(stream)
            # The source yields nothing more: without the re-send this waits forever.
            again = await anext(stream)
            third = await anext(stream)
        assert again == first == third
        assert [d.device.device_name for d in again.devices] == ["gpu-0", "gpu-1"]
        servicer.close()
        async with asyncio.timeout(5):
            assert [m async for m in stream] == []  # close still ends the stream


def test_resend_comes_at_a_third_of_the_shortest_lease() -> None:
    assert resend_after([gpu("gpu-0")]) == KUBELET_DEFAULT_LEASE_S / 3
    assert resend_after([gpu("gpu-0"), gpu("gpu-1", lease_s=6)]) == 2
    assert resend_after([gpu("gpu-0", lease_s=60)]) == 20  # longer than the default: kept
    assert resend_after([]) == KUBELET_DEFAULT_LEASE_S / 3
