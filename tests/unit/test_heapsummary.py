"""The heap summary on SIGUSR2 (driver.heapsummary): what grew, and where."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import tracemalloc
from collections.abc import Iterator

import pytest

from driver import heapsummary
from tests.signals import LogSignal

KEPT: list[bytes] = []


def grow() -> None:
    KEPT.extend(bytes(1000) for _ in range(2000))  # about 2 MB kept from this line


@pytest.fixture
def tracing() -> Iterator[None]:
    heapsummary._previous.clear()
    tracemalloc.start(1)
    yield
    tracemalloc.stop()
    heapsummary._previous.clear()
    KEPT.clear()


def test_without_tracing_the_summary_says_how_to_turn_it_on() -> None:
    assert not tracemalloc.is_tracing()
    (line,) = heapsummary.summary()
    assert "PYTHONTRACEMALLOC" in line


def test_the_second_summary_names_the_line_that_grew(tracing: None) -> None:
    heapsummary.summary()
    grow()
    first, *sites = heapsummary.summary()
    assert first.startswith("traced ")
    top = sites[0]
    assert __file__ in top and f":{grow.__code__.co_firstlineno + 1}" in top, sites
    grown = re.match(r"\+([0-9.]+) kB \(\+(\d+) blocks\)", top)
    assert grown and float(grown[1]) >= 2000 and int(grown[2]) >= 2000, top


def test_a_third_summary_compares_with_the_second(tracing: None) -> None:
    heapsummary.summary()
    grow()
    heapsummary.summary()
    _, *sites = heapsummary.summary()  # nothing grew since the second
    assert not any(__file__ in s and s.startswith("+2") for s in sites), sites


def test_sigusr2_logs_a_summary_on_the_loop(
    tracing: None, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        heapsummary.install(asyncio.get_running_loop())
        try:
            with LogSignal.on("driver.heapsummary", logging.INFO) as lines:
                os.kill(os.getpid(), signal.SIGUSR2)
                await lines.until_logged("heap: traced")
        finally:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2)

    with caplog.at_level(logging.INFO, logger="driver.heapsummary"):
        asyncio.run(main())
    assert any("heap: traced" in r.getMessage() for r in caplog.records)
