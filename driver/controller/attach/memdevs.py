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

What an attach found is remembered per fabric device (:meth:`MemdevArrivals.note`)
until its detach: a warm spare that is an LD is published under its memdev's
node name (``driver.controller.spares.keeper``), and a claim that takes it
later makes no request and is told its memdev from here, not guessed.
A restarted controller noted nothing: each pass reads what the ready
claims' status names (:func:`claimed`: ``fabricDevice`` and ``pciBusID``)
into the notes (:meth:`MemdevArrivals.learn`), so an LD attached before the
restart is still known as its memdev, and a sibling LD's adopted attach or
spare is not confused with it.

A released LD is detached only once the node no longer holds it prepared;
the node reports that by memdev (``busy``), so :func:`still_prepared` counts
a busy memdev of the LD's serial as this LD's unless a live allocation on
that node names it (its ``pciBusID``).

Concurrency: used on the controller's asyncio loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

from driver.controller.claims import FabricAllocation
from driver.cxl import KIND as CXL_MEMORY
from driver.fabric_devices.naming import NodeFabric, cxl_bdf_of, cxl_key, cxl_serial_of
from driver.fabricclient.model import FabricDevice, FabricInventory


class MemdevArrivals:
    """One lock per (node, serial) and the rule that picks the new memdev."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._users: dict[tuple[str, str], int] = {}
        self._found: dict[str, str] = {}  # fabric device id -> its memdev's key

    def note(self, device_id: str, key: str) -> None:
        """``device_id`` is attached as the memdev ``key`` (until its detach)."""
        if key:
            self._found[device_id] = key
        else:
            self._found.pop(device_id, None)

    def learn(self, claimed: Iterable[tuple[str, str]]) -> None:
        """Note each ``(device id, memdev key)`` not noted yet (:func:`claimed`:
        what the claims' status says; what this incarnation saw comes first)."""
        for device_id, key in claimed:
            if key:
                self._found.setdefault(device_id, key)

    def forget(self, device_id: str) -> None:
        """``device_id`` was detached (or is asked for again): its memdev is gone."""
        self._found.pop(device_id, None)

    def found(self, device_id: str) -> str:
        """The key ``note`` gave ``device_id`` ("" if none)."""
        return self._found.get(device_id, "")

    def adopted(
        self, report: NodeFabric | None, device_id: str, serial: str, adapter: str, hint: str = ""
    ) -> str:
        """The memdev of ``device_id`` (an LD of ``serial``) attached behind
        ``adapter`` when no request was seen: the one noted for it, else
        ``hint`` (its published spare's), while the node still shows it there;
        else the one memdev of ``serial`` there that no other device was
        noted as; "" while none such (or from an older plugin)."""
        if report is None:
            return ""
        keys = report.memdevs(serial, adapter)
        for key in (self._found.get(device_id, ""), hint):
            if key and key in keys:
                return key
        others = {k for d, k in self._found.items() if d != device_id}
        left = [k for k in keys if k not in others]
        return left[0] if len(left) == 1 else ""

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


def claimed(allocs: Iterable[FabricAllocation], inv: FabricInventory) -> list[tuple[str, str]]:
    """``(device id, memdev key)`` of each ready, unfailed allocation of CXL
    memory whose status names the memdev its LD arrived as (``pciBusID``)."""
    cxl = {d.id: d.identity for d in inv.devices if d.kind == CXL_MEMORY and d.identity}
    return [
        (a.served, cxl_key(cxl[a.served], a.memdev))
        for a in allocs
        if a.ready and not a.failed and a.memdev and a.served in cxl
    ]


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


def still_prepared(
    report: NodeFabric, device: FabricDevice, node: str, kept: frozenset[tuple[str, str]]
) -> bool:
    """Whether ``node`` may still hold ``device`` (attached there, needed by no
    allocation) prepared: its identity is busy there; for CXL memory reported
    by memdev, a busy memdev of its serial that no live allocation's memdev
    (``kept``: (node, BDF)) explains."""
    if device.kind != CXL_MEMORY:
        return device.identity in report.busy
    keyed = [k for k in report.busy if cxl_bdf_of(k) and cxl_serial_of(k) == device.identity]
    if not keyed:  # nothing of it busy, or an older plugin's report by serial
        return device.identity in report.busy
    return any((node, cxl_bdf_of(k)) not in kept for k in keyed)
