"""Which of a node's CXL memdevs is the logical device an attach brought.

Why a module: the logical devices (LDs) of one CXL multi-logical device
share the serial, and Linux shows no LD id, so a node tells two of them
apart only by the memdev's PCI function (its key ``<serial>@<BDF>``,
``driver.fabric_devices.naming.cxl_key``), which no fabric manager reports
(docs/fabric.md, "Logical devices"). The attach therefore follows what
arrives, as a count-based manager's slot does: it notes the node's memdevs of
that serial behind the adapter just before it asks, and takes the one that is
new afterwards. Attaches of one serial to one node are asked one at a time
(:meth:`MemdevArrivals.one_at_a_time`), so at most one new memdev of it is in
question. Where no request was made (an earlier one adopted: a restart after
the request), a memdev alone with its serial there is the LD; with two or
more there, which one is this LD cannot be told, and the attach fails
naming them.

Concurrency: used on the controller's asyncio loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from driver.fabric_devices.naming import NodeFabric


class MemdevArrivals:
    """One lock per (node, serial) and the rule that picks the new memdev."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._users: dict[tuple[str, str], int] = {}

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, node: str, serial: str) -> AsyncIterator[None]:
        """Held while one LD of ``serial`` is attached to ``node`` and its memdev found."""
        key = (node, serial)
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:  # no one waits: forget it
                del self._users[key], self._locks[key]


def before(report: NodeFabric | None, serial: str, adapter: str) -> frozenset[str]:
    """The node's memdev keys of ``serial`` behind ``adapter`` now."""
    return frozenset(report.memdevs(serial, adapter)) if report is not None else frozenset()


def arrived(
    report: NodeFabric | None, serial: str, adapter: str, seen: frozenset[str] | None
) -> str:
    """The key of the memdev the attach brought: the one not in ``seen`` (what
    was there before the request), or with no request made (``seen`` None)
    the one alone with its serial there; "" while there is none such (or from
    an older plugin, which reports serials only)."""
    if report is None:
        return ""
    keys = report.memdevs(serial, adapter)
    new = keys if seen is None else [k for k in keys if k not in seen]
    return new[0] if len(new) == 1 else ""


def undecided(report: NodeFabric | None, serial: str, adapter: str) -> list[str]:
    """What the node shows of ``serial`` behind ``adapter`` (for the error)."""
    return report.memdevs(serial, adapter) if report is not None else []
