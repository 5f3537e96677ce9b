"""The node plugins' fabric reports, with a signal when one changes.

Why: an attach is done when the node's plugin reports the device behind the
adapter (its ``patchbay.dev/fabric`` annotation, ``driver.fabric_devices``).
The reconciler parses every Node's report once per pass and hands them
here; an attach worker waits on :meth:`NodeReports.wait_until` and is woken
when a report changes, instead of polling the Node cache.

Concurrency: used on the controller's asyncio loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from driver.fabric_devices.naming import NodeFabric


class NodeReports:
    """The last parsed report of each Node that has one."""

    def __init__(self) -> None:
        self._reports: dict[str, NodeFabric] = {}
        self._changed = asyncio.Event()

    def refresh(self, nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, NodeFabric]:
        """Parse the Nodes' reports (by node name); wake the waiters if any changed."""
        reports = {}
        for name, node in nodes.items():
            report = NodeFabric.from_node(node)
            if report is not None:
                reports[name] = report
        if reports != self._reports:
            self._reports = reports
            self._changed.set()
            self._changed = asyncio.Event()  # the next change wakes the next waiters
        return reports

    def get(self, node: str) -> NodeFabric | None:
        return self._reports.get(node)

    def sees(self, node: str, kind: str, identity: str, adapter: str) -> bool:
        """Whether ``node`` reports the ``kind`` device ``identity`` behind ``adapter``."""
        report = self._reports.get(node)
        return report is not None and report.sees(kind, identity, adapter)

    async def wait_until(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``predicate()`` holds, re-checked on every change; False at ``deadline``.

        ``deadline`` is a :func:`time.monotonic` time.
        """
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # not wait_for: docs/design.md
                    await self._changed.wait()
        return True
