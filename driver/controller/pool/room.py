"""Adapter room: how many fabric devices one host adapter can take.

Why a module: a host port of a fabric switch can bind only so many devices.
In DMTF's model that is the Virtual CXL Switch (VCS) the host's upstream
port is bound to: each device it takes is bound to one of the VCS's virtual
PCI-to-PCI bridges (vPPBs), so the number of vPPBs is the adapter's room
(the client reads it: ``HostAdapter.room``, 0 when the fabric does not
say, and then nothing is limited; adapters bound to one virtual switch,
``HostAdapter.vcs``, share its room). The scheduler cannot keep it (a device
in a domain pool has no adapter until attached, and a claim that asks for
no adapter would not consume one: docs/fabric.md, "Adapter room"), so the
controller keeps it in two places:

- a node whose every reported adapter into a reach domain is full is cut
  out of that domain's pools (:func:`full_nodes`), so the scheduler places
  the next claim elsewhere, and takes it back once a device leaves;
- an attach through a full adapter is refused (:class:`AdapterRoom`): the
  claim gets ``FabricDeviceFailed`` naming the adapter and the node, the
  device is not held (it is not at fault), and the scheduler tries again
  (the cut is stored first). That covers an allocation the scheduler made
  before the cut was stored.

A device takes room from its attach request until it is detached: every
binding of the inventory through the adapter counts, warm spares and
attaches under way included. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

from driver.controller.pool.variant import Variant
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricDevice, FabricInventory

Port = tuple[str, str]  # (node, adapter)


def groups(inv: FabricInventory) -> dict[Port, str]:
    """(node, adapter) -> the room it shares (its virtual switch; itself when
    the fabric names none), for the adapters whose fabric says a room."""
    return {(a.node, a.adapter): a.vcs or f"{a.node}/{a.adapter}" for a in inv.adapters
            if a.room > 0}  # fmt: skip


def rooms(inv: FabricInventory) -> dict[str, int]:
    """Each room (:func:`groups`) -> how many devices it takes."""
    of = groups(inv)
    return {of[(a.node, a.adapter)]: a.room for a in inv.adapters if a.room > 0}


def occupants(inv: FabricInventory) -> dict[str, set[str]]:
    """Each room -> the devices bound through its adapters, in any state."""
    of, out = groups(inv), dict[str, set[str]]()
    for d in inv.devices:
        for c in d.connections or ((d.connection,) if d.connection else ()):
            room = of.get((c.node, c.adapter))
            if room is not None:
                out.setdefault(room, set()).add(d.id)
    return out


def full_adapters(inv: FabricInventory) -> set[Port]:
    """The adapters with no room left."""
    taken, size = occupants(inv), rooms(inv)
    return {p for p, g in groups(inv).items() if len(taken.get(g, ())) >= size[g]}


def full_nodes(
    devices: Iterable[FabricDevice], reports: Mapping[str, NodeFabric], full: Collection[Port]
) -> set[str]:
    """The nodes whose every reported adapter that reaches one of ``devices``
    (a reach domain's) is full."""
    into: dict[str, set[str]] = {}
    for d in devices:
        for a in d.adapters:
            report = reports.get(a.node)
            if report is not None and a.adapter in report.adapters:
                into.setdefault(a.node, set()).add(a.adapter)
    return {n for n, adapters in into.items() if all((n, x) in full for x in adapters)}


def no_room(adapter: str, node: str, room: int) -> str:
    """The refusal's message: it names the adapter and the node."""
    return (
        f"fabric adapter {adapter} on node {node} has no room: its {room} slots "
        "(the vPPBs of its virtual switch) hold devices already"
    )


class AdapterRoom:
    """One pass's admission of attaches against the adapters' room.

    :meth:`admit` the attaches already under way first (they hold room
    already), then the new ones in a stable order: each admitted device
    takes a slot of its adapter for the rest of the pass."""

    def __init__(self, inv: FabricInventory) -> None:
        self._groups, self._rooms, self._taken = groups(inv), rooms(inv), occupants(inv)

    def admit(self, v: Variant) -> Variant:
        """``v``, or ``v`` marked ``full`` with why when its adapter has no room."""
        group = self._groups.get((v.node, v.adapter))
        if not v.adapter or group is None:
            return v
        room, taken = self._rooms[group], self._taken.setdefault(group, set())
        if v.device_id in taken:
            return v
        if len(taken) >= room:
            return dataclasses.replace(v, full=True, why=no_room(v.adapter, v.node, room))
        taken.add(v.device_id)
        return v
