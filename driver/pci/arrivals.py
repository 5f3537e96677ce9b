"""Which PCI functions have finished arriving, as far as this process knows.

Why this module exists: a rescan runs after a burst of hot-plug events, and
it lists every function on the bus, also one whose own ``add`` event has not
been processed yet. The kernel creates a device before it announces it, and
drivers keep building on it until then (a PF's netdev, its SR-IOV state), so
the plugin must not reconfigure such a function: a scan that found a NIC
half-built once reset it through zero VFs under the hands of whoever was
still adding it. A function is *settled* when it was present at the first
scan (the hot-plug source is opened before it, so nothing falls between) or
when its ``add`` event has been processed; a ``remove`` event forgets it.
Listing is not gated, only changing a function: a rescan may offer what it
finds, but leaves an unsettled PF's VF count alone until its ``add`` arrives
and triggers the next rescan.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Arrivals:
    """The settled functions; ``tracking`` False (no hot-plug source) settles all."""

    def __init__(self, tracking: bool = True) -> None:
        self.tracking = tracking
        self._known: set[str] = set()
        self._baseline_taken = False
        self._lock = threading.Lock()

    def settled(self, present: Iterable[str]) -> set[str]:
        """Which of the functions present now may be changed. The first call
        takes every present function as settled (the initial scan)."""
        now = set(present)
        if not self.tracking:
            return now
        with self._lock:
            if not self._baseline_taken:
                self._known |= now
                self._baseline_taken = True
            return now & self._known

    def note(self, action: str, slot: str) -> None:
        """An event for PCI function ``slot`` (``0000:87:00.0``) was processed."""
        if not self.tracking or not slot:
            return
        with self._lock:
            if action == "add":
                self._known.add(slot)
            elif action == "remove":
                self._known.discard(slot)
