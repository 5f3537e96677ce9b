"""The one module that imports ``pyudev``: kernel PCI add/remove events.

Blocking: iterate :func:`pci_events` in a dedicated thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def pci_events() -> Iterator[Any]:
    """pyudev devices for every ``pci`` uevent, forever."""
    import pyudev

    context = pyudev.Context()
    monitor = pyudev.Monitor.from_netlink(context)
    monitor.filter_by(subsystem="pci")
    monitor.start()
    yield from iter(monitor.poll, None)
