"""Fabric devices attached to hosts that are not this cluster's nodes.

Why: a fabric may be shared with hosts outside the cluster, and the client
names an attachment's host by what the manager says (a ComputerSystem's
``HostName``, the ``fabric_systems`` setting, a Node's ``systemUUID``), or
"" when nothing maps it to a node. The controller changes only what it owns:
a device attached to a host that is not one of its nodes is neither
published (a claim would take it, and the attach would detach it from that
host first) nor detached (no claim of ours needs it, so it would look like
a leftover). It stays as it is until that host lets it go.

Which hosts are ours: those a Node object names, and those one named while
this controller ran. A Node deleted under a running controller (a machine
scaled away) is one of ours: what is attached to it is detached, as a
node whose Node object is gone holds nothing. A restarted controller never
saw that Node: it leaves the device alone (safe, not leak-free; an operator
detaches it, or a Node of that name brings it back into the controller's
care). An attachment to "" (a host no node maps to) is never ours.

Concurrency: used on the controller's asyncio loop only.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from driver.fabricclient.model import FabricDevice, FabricInventory

log = logging.getLogger(__name__)


def bindings(device: FabricDevice) -> tuple[str, ...]:
    """The hosts ``device`` is bound to (attached, on the way, or failed)."""
    conns = device.connections or ((device.connection,) if device.connection else ())
    return tuple(c.node for c in conns)


class OtherHosts:
    """The devices attached to hosts that are not the controller's nodes."""

    def __init__(self) -> None:
        self._ours: set[str] = set()  # every Node name seen while this controller ran
        self._told: dict[str, tuple[str, ...]] = {}  # device -> its other hosts, as logged

    def devices(self, inv: FabricInventory, nodes: Collection[str]) -> frozenset[str]:
        """The ids of the devices bound to a host that is not one of ours
        (``nodes``: the Node objects' names now)."""
        self._ours.update(nodes)
        found: dict[str, tuple[str, ...]] = {}
        for d in inv.devices:
            others = tuple(sorted({h for h in bindings(d) if not h or h not in self._ours}))
            if others:
                found[d.id] = others
        for ident, others in sorted(found.items()):
            if self._told.get(ident) != others:
                hosts = ", ".join(h or "a host no node maps to" for h in others)
                log.info("%s is attached to %s, not a node of this cluster: neither "
                         "published nor detached", ident, hosts)  # fmt: skip
        self._told = found
        return frozenset(found)
