"""``kubectl patchbay fabric``: the fabric pool as the controller sees it.

From the API alone: the fabric pool's ResourceSlices (one variant per
physical device and node adapter that reaches it, ``fabricDevice``,
``fabricSwitch``, ``fabricAdapter``, ``pcieRoot``; one counter per physical
device in the pool's counter sets), the nodes' fabric reports (the
``patchbay.dev/fabric`` annotation: adapter roots, attached GPU UUIDs and
NIC MACs, those a prepared claim holds), the claims allocated from the
pool with the binding conditions the controller writes, and error Events.

Per physical device: where it could be attached (its variants), where it
is attached (a node reports its UUID or MAC behind an adapter), whether a
claim holds it (with the binding state), it is a **spare** (attached in
advance, its variant there published with ``spare: true`` and no binding
conditions: docs/fabric.md, "Warm spares") or free, or **withheld**:
the pool still counts it but offers no variant, which the controller does
while a device is held after a failed attach, while the fabric reports it
critical or unavailable, or while no reported adapter reaches it; the
``why`` is the failure condition on the claim, else (withheld) the newest
error Event naming the device. A hold is read from the Warnings that say it
(``driver.fabric_devices.holds``: the device, the hold's length; until when
is the Event's time plus that): in the per-domain shape a held device is
published nowhere and has no counter, so a live hold is what lists it.
Allocations of variants no longer published (the controller drops a failed
device at once) are listed by variant name.

In the per-domain shape (each device once, in a pool per reach domain:
``driver.inspect.fabric_domains``) a device of a domain pool is reachable
from the Nodes its pool's slices select (no adapter until attached), a
claim holding it is on the node its allocation is bound to (the
scheduler's ``nodeSelector``; the adapter is the controller's pick, seen once
the node reports the device attached), and the view lists the domain
pools: their Nodes and devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from driver.fabric_devices.holds import hold_in
from driver.fabric_devices.naming import (
    FABRIC_KIND,
    FABRIC_POOL,
    IDENTITY_ATTRIBUTE,
    SPARE_ATTRIBUTE,
    NodeFabric,
    in_fabric_pool,
    is_adapter_pool,
)
from driver.health.monitor import TAINT_KEY as FAILED_TAINT
from driver.inspect.claims import binding, binding_text
from driver.inspect.events import EventIndex, Reported, event_time, newest, parse_time
from driver.inspect.fabric_domains import domain_pools, selected_nodes
from driver.inspect.inventory import PCIE_ROOT, JsonObj, build
from driver.inspect.table import table
from driver.kube.reservations import allocated_node, reserved_for
from driver.leaseterms import format_duration


def reports(nodes: Iterable[JsonObj]) -> dict[str, NodeFabric]:
    """Node name -> its fabric report, for the nodes that have one."""
    out = {}
    for n in nodes:
        report = NodeFabric.from_node(n)
        if report is not None:
            out[str((n.get("metadata") or {}).get("name"))] = report
    return out


def _allocations(claims: Iterable[JsonObj], pool: str, now: datetime) -> dict[str, dict[str, Any]]:
    """Variant name -> the claim holding it, its pods or PodGroup, its binding state."""
    out = {}
    for c in claims:
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        allocation = status.get("allocation") or {}
        entries = {(e.get("pool"), e.get("device")): e for e in status.get("devices") or ()}
        reservation = reserved_for(c)
        for r in (allocation.get("devices") or {}).get("results") or ():
            if not in_fabric_pool(str(r.get("pool")), pool):
                continue
            b = binding(
                r,
                entries.get((r.get("pool"), r.get("device"))) or {},
                str(allocation.get("allocationTimestamp", "")),
                now,
            )
            out[str(r["device"])] = {
                "node": allocated_node(allocation) or None,  # per-domain: the variant names none
                "claim": f"{meta.get('namespace')}/{meta.get('name')}",
                "pods": list(reservation.pods),
                "podGroups": list(reservation.pod_groups),
                "binding": b,
            }
    return out


def _blank(name: str, holder: dict[str, Any] | None = None) -> dict[str, Any]:
    """A row for a device (or variant) no published variant describes."""
    return {
        "device": name,
        "pool": None,
        "type": None,
        "switch": None,
        "model": None,
        "identity": None,
        "reachable": [],
        "attached": None,
        "holder": holder,
        "spare": None,
        "failed": None,
        "hold": None,
    }


def _holds(events: Iterable[JsonObj], now: datetime) -> dict[str, tuple[datetime, Reported]]:
    """Device id -> until when a Warning says it is held and that Warning, for
    the holds not over at ``now`` (the latest end when several say so)."""
    out: dict[str, tuple[datetime, Reported]] = {}
    for e in events:
        said = hold_in(str(e.get("message", ""))) if e.get("type") == "Warning" else None
        when = parse_time(event_time(e)) if said else None
        if said is None or when is None:
            continue
        device, until = said[0], when + timedelta(seconds=said[1])
        if until > now and (device not in out or until > out[device][0]):
            out[device] = (until, newest([e]) or Reported("", "", "", ""))
    return out


def _pool_counters(slices: Iterable[JsonObj], pool: str) -> set[str]:
    """Every counter of the pool's counter sets: one per physical device."""
    out = set()
    for s in slices:
        spec = s.get("spec") or {}
        if (spec.get("pool") or {}).get("name") == pool:
            for cs in spec.get("sharedCounters") or ():
                out |= {str(k) for k in cs.get("counters") or {}}
    return out


def _why(d: Mapping[str, Any], index: EventIndex, hold: Reported | None) -> dict[str, Any] | None:
    """The failed binding's condition, else for a withheld device, or one still
    attached that no claim holds (its detach under way, or refused: CXL memory
    in use), the newest error Event naming it (a held one's old errors are not
    its state now)."""
    b = (d["holder"] or {}).get("binding") or {}
    if b.get("state") == "failed":
        return {"reason": b["reason"], "message": b["message"], "object": d["holder"]["claim"]}
    left = d["attached"] is not None and not d["holder"]
    last = newest(index.naming(d["device"])) if d["state"] == "withheld" or left else None
    last = last or (hold if d["state"] == "withheld" else None)  # a spare's: on its Node
    return last.as_dict() if last else None


def fabric_view(
    slices: Iterable[JsonObj],
    claims: Iterable[JsonObj],
    nodes: Iterable[JsonObj],
    events: Iterable[JsonObj],
    now: datetime,
    pool: str = FABRIC_POOL,
) -> dict[str, Any]:
    """The pool's devices (by id) and the nodes' adapters, as plain data."""
    slices, claims, events = list(slices), list(claims), list(events)
    held = _allocations(claims, pool, now)
    seen = reports(nodes)
    unoffered = _pool_counters(slices, pool)
    variants = [  # a node's adapter pool holds its adapters (pairings), no fabric device
        d for d in build(slices, claims).devices
        if in_fabric_pool(d.pool, pool) and not is_adapter_pool(d.pool, pool)
    ]  # fmt: skip
    domains = domain_pools(slices, nodes, pool)
    selects = selected_nodes(domains)
    by_id: dict[str, dict[str, Any]] = {}
    for v in sorted(variants, key=lambda v: (v.node, str(v.attr("fabricAdapter")))):
        # A count-based manager's model slot stands for no one device (controller.pool.slots).
        dev_id = str(v.attr("fabricDevice") or v.attr("fabricSlot"))
        at = v.attr("fabricAdapter")
        adapter = None if at is None else str(at)
        d = by_id.setdefault(dev_id, _blank(dev_id))
        d |= {
            "pool": v.pool,
            "type": v.type,
            "switch": v.attr("fabricSwitch"),
            "model": v.attr("productName"),
            "identity": v.attr(IDENTITY_ATTRIBUTE[FABRIC_KIND.get(v.type, "nic")]),
        }
        if v.node:
            d["reachable"].append(
                {"node": v.node, "adapter": adapter, "pcieRoot": v.attr(PCIE_ROOT),
                 "variant": v.name}
            )  # fmt: skip
        else:  # published once: any Node its domain pool selects, no adapter until attached
            d["reachable"] += [{"node": n, "adapter": None, "pcieRoot": None, "variant": v.name}
                               for n in selects.get(v.pool, ())]  # fmt: skip
        for t in v.taints:  # a GPU a node found failed (docs/health.md, "The fabric path")
            if t.get("key") == FAILED_TAINT:
                d["failed"] = {"reason": t.get("value", ""), "effect": t.get("effect"),
                               "since": t.get("timeAdded")}  # fmt: skip
        if v.attr(SPARE_ATTRIBUTE) is True:  # published as a warm spare there
            d["spare"] = {"node": v.node, "adapter": adapter, "variant": v.name}
        if v.name in held:
            h = held.pop(v.name)
            d["holder"] = (
                {"variant": v.name, "adapter": adapter} | h | {"node": v.node or h["node"]}
            )
        unoffered -= {counter for _, counter, _ in v.consumes()}
    for node, r in sorted(seen.items()):
        for d in by_id.values():
            kind = FABRIC_KIND.get(str(d["type"]), "nic")
            attached = r.attached(kind).get(str(d["identity"]))
            if attached is not None:
                d["attached"] = {"node": node, "adapter": attached, "busy": d["identity"] in r.busy}
    by_id |= {name: _blank(name) for name in unoffered}  # counted by the pool, offered nowhere
    holds = _holds(events, now)  # per-domain: a held device is published nowhere
    by_id |= {name: _blank(name) for name in holds if name not in by_id}
    # Allocated variants no longer published (the controller drops a failed device at once).
    by_id |= {name: _blank(name, {"variant": name} | h) for name, h in held.items()}
    index = EventIndex(events)
    for d in by_id.values():
        d["state"] = (
            "held"
            if d["holder"]
            else "failed"
            if d["failed"]
            else "spare"
            if d["spare"]
            else "free"
            if d["reachable"]
            else "withheld"
        )
        until, said = holds.get(d["device"]) or (None, None)
        if until is not None and d["state"] == "withheld":
            d["hold"] = {"until": until.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "secondsLeft": (until - now).total_seconds()}  # fmt: skip
        d["why"] = _why(d, index, said)
    adapters = [
        {"node": n, "adapter": a, "pcieRoot": root}
        for n, r in sorted(seen.items())
        for a, root in sorted(r.adapters.items())
    ]
    return {
        "pool": pool,
        "devices": sorted(by_id.values(), key=lambda d: d["device"]),
        "adapters": adapters,
        "domains": domains,
    }


def _state(d: Mapping[str, Any]) -> str:
    b = (d["holder"] or {}).get("binding")
    spare, failed = d.get("spare"), d.get("failed")
    if b:
        state = f"held, {binding_text(b).split(':')[0]}"
    elif spare and d["state"] == "spare":
        state = f"spare on {spare['node']}"
    elif failed and failed["effect"] == "NoSchedule" and not d["holder"]:
        state = "held out"  # detached, tainted NoSchedule (docs/health.md, "The fabric path")
    elif d.get("hold"):
        state = f"withheld, {format_duration(d['hold']['secondsLeft'])} left"
    else:
        state = str(d["state"])
    return f"{state}, failed {failed['reason']}" if failed else state


def _holder_text(h: Mapping[str, Any]) -> str:
    """``ns/claim pod a,b`` or ``ns/claim podgroup g`` (a PodGroup's claim names no pod)."""
    text = str(h["claim"])
    text += f" pod {','.join(h['pods'])}" if h.get("pods") else ""
    return text + (f" podgroup {','.join(h['podGroups'])}" if h.get("podGroups") else "")


def render_fabric(view: Mapping[str, Any], wide: bool = False) -> str:
    head = ["DEVICE", "TYPE", "STATE", "ATTACHED", "REACHABLE", "CLAIM", "WHY"]
    if wide:
        head[2:2] = ["SWITCH", "MODEL"]
    rows = []
    for d in view["devices"]:
        att = d["attached"]
        attached = (
            f"{att['node']}/{att['adapter']}" + (" (prepared)" if att["busy"] else "")
            if att
            else "-"
        )
        reach = (
            ",".join(
                f"{r['node']}/{r['adapter']}" if r["adapter"] else r["node"] for r in d["reachable"]
            )
            or "-"
        )
        h = d["holder"]
        claim = _holder_text(h) if h else "-"
        why = f"{d['why']['reason']}: {d['why']['message']}" if d["why"] else ""
        if why and not wide and len(why) > 70:
            why = why[:69] + "…"
        row = [d["device"], d["type"] or "?", _state(d), attached, reach, claim, why]
        if wide:
            row[2:2] = [d["switch"] or "?", d["model"] or "?"]
        rows.append(row)
    text = table(head, rows)
    if view.get("domains"):
        text += "\n" + table(
            ["DOMAIN POOL", "NODES", "CUT", "DEVICES"],
            [
                [p["pool"], ",".join(p["nodes"]) or "-", ",".join(p["cut"]) or "-",
                 ",".join(p["devices"]) or "-"]
                for p in view["domains"]
            ],
        )  # fmt: skip
    if view["adapters"]:
        text += "\n" + table(
            ["NODE", "ADAPTER", "PCIEROOT"],
            [[a["node"], a["adapter"], a["pcieRoot"]] for a in view["adapters"]],
        )
    return text
