"""What the count face knows: machines, their resources, and which device a scale-up takes.

Why a module: a count-based manager picks the device itself. Here a machine
is a node (its ``mach_uuid`` is the node's ComputerSystem UUID, so both faces
name a host alike) and a resource is a fabric device attached to one of the
node's adapters. A scale-up for "one of model X" takes the first free device
of that type and model (sorted by id) on a switch one of the machine's
adapters reaches: not attached, not another tenant's, not Critical. The
test-only faults (knobs ``count_wrong_model`` and ``count_nothing``, counted
down one per scale-up) make it take a device of another model instead, or
nothing. Every function here runs on the service's worker thread.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

from fabric.service.count_wire import FmError, condition
from fabric.service.hardware import system_uuid
from fabric.service.inventory import Initiator, Inventory, Target
from fabric.service.store import Store

_NS = uuidlib.UUID("8a1f6a0e-3c2d-4b8e-9f41-5c0d2e7b9a63")
OP_STATUS = {"OK": "0", "Warning": "1", "Critical": "2"}  # res_op_status' first digit
WRONG_MODEL, NOTHING = "count_wrong_model", "count_nothing"


def res_uuid(t: Target) -> str:
    """The manager's own id of a device (stable across restarts)."""
    return str(uuidlib.uuid5(_NS, f"{t.fabric}/{t.id}"))


@dataclass(frozen=True)
class Machine:
    uuid: str
    number: int
    node: str
    initiators: tuple[Initiator, ...]


def machines(inv: Inventory) -> dict[str, Machine]:
    nodes = sorted({i.node for i in inv.initiators.values()})
    return {
        system_uuid(n): Machine(
            system_uuid(n), k + 1, n,
            tuple(sorted((i for i in inv.initiators.values() if i.node == n), key=lambda i: i.id)),
        )
        for k, n in enumerate(nodes)
    }  # fmt: skip


def machine_of(inv: Inventory, mach_uuid: str) -> Machine:
    found = machines(inv).get(mach_uuid)
    if found is None:
        raise FmError(404, "E40400", f"mach_uuid {mach_uuid}: no such machine")
    return found


def resource(store: Store, t: Target) -> dict[str, Any]:
    health = store.device(t.id).health
    return {
        "res_uuid": res_uuid(t),
        "res_name": t.id,
        "res_type": t.kind,
        "res_status": 0,
        "res_op_status": OP_STATUS.get(health, "9") + "0",
        "res_serial_num": t.serial,
        "res_spec": condition(t.model),
    }


def machine_json(inv: Inventory, store: Store, m: Machine, tenant: str, res: list[Target]) -> Any:
    first = m.initiators[0].fabric if m.initiators else ""
    return {
        "fabric_uuid": str(uuidlib.uuid5(_NS, f"fabric/{first}")),
        "fabric_id": sorted(inv.fabrics).index(first) + 1 if first else 0,
        "mach_uuid": m.uuid,
        "mach_id": m.number,
        "mach_name": m.node,
        "tenant_uuid": tenant,
        "mach_status": 0,
        "mach_status_detail": "",
        "resources": [resource(store, t) for t in res],
    }


def attached(inv: Inventory, store: Store, m: Machine) -> list[Target]:
    """The devices attached (or attaching) to the machine's adapters."""
    mine = {i.id for i in m.initiators}
    conns = [c for c in store.connections() if c.initiator in mine]
    return sorted((inv.targets[c.device] for c in conns), key=lambda t: t.id)


def _free(inv: Inventory, store: Store, m: Machine, kind: str) -> list[tuple[Target, Initiator]]:
    out = []
    for t in sorted(inv.targets.values(), key=lambda t: t.id):
        via = [i for i in m.initiators if (i.fabric, i.switch) == (t.fabric, t.switch)]
        state = store.device(t.id)
        if t.kind != kind or not via or state.foreign_owner or state.health == "Critical":
            continue
        if store.connection_of(t.id) is None:
            out.append((t, via[0]))
    return out


def pick(
    inv: Inventory, store: Store, m: Machine, kind: str, model: str
) -> tuple[Target, Initiator] | None:
    """The device a scale-up for one ``kind``/``model`` takes (None: a fault says nothing);
    the pick is recorded in the audit (dialect ``count``)."""
    free = _free(inv, store, m, kind)
    if store.take(NOTHING):
        chosen = None
    elif store.take(WRONG_MODEL):
        chosen = next((f for f in free if f[0].model != model), None)
    else:
        chosen = next((f for f in free if f[0].model == model), None)
        if chosen is None:
            raise FmError(
                409, "E40900", f"no free {kind} of model {model} behind machine {m.uuid} ({m.node})"
            )
    where = chosen[1] if chosen else (m.initiators[0] if m.initiators else None)
    store.record_attach_request(
        chosen[0].id if chosen else "", f"{m.node}/{where.adapter if where else ''}", "count"
    )
    return chosen


def resource_by_uuid(inv: Inventory, ident: str) -> Target:
    for t in inv.targets.values():
        if res_uuid(t) == ident:
            return t
    raise FmError(404, "E40401", f"res_uuid {ident}: no such resource")
