"""The one module that imports ``pyudev``: kernel PCI add/remove events.

Also the events of what a driver builds on a PCI function after its own
``add``, which a rescan at that ``add`` can come too early for: NVMe
namespaces (``block`` disks, after the controller's asynchronous scan),
NVMe controllers (``nvme``: state changes) and CXL memory's dax devices
(``dax``, once a region is assembled).

Blocking: iterate :func:`pci_events` in a dedicated thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def pci_events() -> Iterator[Any]:
    """pyudev devices for every ``pci``, ``nvme``, ``dax`` and block-disk uevent, forever.

    The monitor starts listening here, not at the first ``next``: the plugin
    opens its source before its first scan, so no event falls between."""
    import pyudev

    context = pyudev.Context()
    monitor = pyudev.Monitor.from_netlink(context)
    monitor.filter_by(subsystem="pci")  # filters add up: an event matching any is seen
    monitor.filter_by(subsystem="block", device_type="disk")
    monitor.filter_by(subsystem="nvme")
    monitor.filter_by(subsystem="dax")
    monitor.start()
    return iter(monitor.poll, None)
