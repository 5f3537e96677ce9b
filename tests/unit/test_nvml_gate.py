"""The NVML gate (``driver.node.nvml_gate``): a GPU family whose scans
survive a host without usable NVML, and the setting that makes NVML mandatory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import pytest

from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.devices.model import Device
from driver.errors import NvmlError
from driver.node import nvml_gate
from driver.node.nvml_gate import NvmlGate
from driver.nvml.backend import NvmlReturn, nvml_error


class Gpus:
    """A GPU family whose NVML init fails with ``error`` (None: it works)."""

    def __init__(self) -> None:
        self.error: NvmlReturn | None = None
        self.found = Discovery(devices=(Device(name="gpu-0", kind="gpu", local_id="GPU-0"),))

    def discover(self) -> Discovery:
        if self.error is not None:
            raise nvml_error(self.error)
        return self.found

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {}


@pytest.mark.parametrize("code", [NvmlReturn.LIBRARY_NOT_FOUND, NvmlReturn.DRIVER_NOT_LOADED])
def test_no_nvml_is_no_gpus_with_the_reason_until_it_works(code: NvmlReturn) -> None:
    gpus = Gpus()
    gpus.error = code
    gate = NvmlGate(gpus)
    assert gate.discover() == Discovery()
    assert gate.reason is not None and code.name in gate.reason
    assert not gate.ever_available
    gpus.error = None
    assert gate.discover() == gpus.found
    assert gate.reason is None and gate.ever_available


def test_required_nvml_propagates_the_error() -> None:
    gpus = Gpus()
    gpus.error = NvmlReturn.LIBRARY_NOT_FOUND
    with pytest.raises(NvmlError, match="LIBRARY_NOT_FOUND"):
        NvmlGate(gpus, required=True).discover()


def test_a_gpu_fault_is_not_taken_for_a_missing_driver() -> None:
    gpus = Gpus()
    gpus.error = NvmlReturn.UNKNOWN
    gate = NvmlGate(gpus)
    with pytest.raises(NvmlError, match="UNKNOWN"):
        gate.discover()
    assert gate.reason is None


def test_the_retry_task_sleeps_without_a_timer_until_nvml_goes_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At rest the task waits on the gate, not on a periodic check (an idle
    plugin does not wake up); NVML going away wakes it and it rescans."""
    monkeypatch.setattr(nvml_gate, "RETRY_BACKOFF_S", (0.01, 0.01))
    gpus = Gpus()
    gate = NvmlGate(gpus)
    gate.discover()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        rescanned = asyncio.Event()

        async def rescan() -> None:
            gpus.error = None
            await asyncio.to_thread(gate.discover)
            rescanned.set()

        task = asyncio.create_task(nvml_gate.retry_while_unavailable([gate], rescan))
        for _ in range(5):
            await asyncio.sleep(0)
        timers = loop._scheduled  # type: ignore[attr-defined]
        assert not timers, "no timer while NVML works"
        gpus.error = NvmlReturn.DRIVER_NOT_LOADED
        await asyncio.to_thread(gate.discover)  # a scan's worker thread sees NVML gone
        await asyncio.wait_for(rescanned.wait(), 30)
        assert gate.reason is None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
