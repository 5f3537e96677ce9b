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
claim holds it (with the binding state) or it is free, or **withheld**:
the pool still counts it but offers no variant, which the controller does
while a device is held after a failed attach, while the fabric reports it
critical or unavailable, or while no reported adapter reaches it; the
``why`` is the failure condition on the claim, else the newest error Event
naming the device. Allocations of variants no longer published (the
controller drops a failed device at once) are listed by variant name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from driver.fabric_devices.naming import FABRIC_POOL, NodeFabric
from driver.inspect.claims import binding, binding_text
from driver.inspect.events import EventIndex, newest
from driver.inspect.inventory import PCIE_ROOT, JsonObj, build
from driver.inspect.table import table


def reports(nodes: Iterable[JsonObj]) -> dict[str, NodeFabric]:
    """Node name -> its fabric report, for the nodes that have one."""
    out = {}
    for n in nodes:
        report = NodeFabric.from_node(n)
        if report is not None:
            out[str((n.get("metadata") or {}).get("name"))] = report
    return out


def _allocations(claims: Iterable[JsonObj], pool: str, now: datetime) -> dict[str, dict[str, Any]]:
    """Variant name -> the claim holding it, its pods and binding state."""
    out = {}
    for c in claims:
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        allocation = status.get("allocation") or {}
        entries = {e.get("device"): e for e in status.get("devices") or () if e.get("pool") == pool}
        pods = [
            str(r["name"]) for r in status.get("reservedFor") or () if r.get("resource") == "pods"
        ]
        for r in (allocation.get("devices") or {}).get("results") or ():
            if r.get("pool") != pool:
                continue
            b = binding(
                r,
                entries.get(r.get("device")) or {},
                str(allocation.get("allocationTimestamp", "")),
                now,
            )
            out[str(r["device"])] = {
                "claim": f"{meta.get('namespace')}/{meta.get('name')}",
                "pods": pods,
                "binding": b,
            }
    return out


def fabric_view(
    slices: Iterable[JsonObj],
    claims: Iterable[JsonObj],
    nodes: Iterable[JsonObj],
    events: Iterable[JsonObj],
    now: datetime,
    pool: str = FABRIC_POOL,
) -> dict[str, Any]:
    slices, claims = list(slices), list(claims)
    held = _allocations(claims, pool, now)
    seen = reports(nodes)
    index = EventIndex(events)
    variants = [d for d in build(slices, claims).devices if d.pool == pool]
    counters = sorted(
        {
            str(k)
            for s in slices
            if ((s.get("spec") or {}).get("pool") or {}).get("name") == pool
            for cs in (s.get("spec") or {}).get("sharedCounters") or ()
            for k in (cs.get("counters") or {})
        }
    )
    by_id: dict[str, dict[str, Any]] = {}
    for v in sorted(variants, key=lambda v: (v.node, str(v.attr("fabricAdapter")))):
        dev_id = str(v.attr("fabricDevice"))
        identity = v.attr("uuid") if v.type == "gpu" else v.attr("macAddress")
        d = by_id.setdefault(
            dev_id,
            {
                "device": dev_id,
                "type": v.type,
                "switch": v.attr("fabricSwitch"),
                "model": v.attr("productName"),
                "identity": identity,
                "reachable": [],
                "attached": None,
                "holder": None,
            },
        )
        adapter = str(v.attr("fabricAdapter"))
        d["reachable"].append(
            {"node": v.node, "adapter": adapter, "pcieRoot": v.attr(PCIE_ROOT), "variant": v.name}
        )
        if v.name in held:
            d["holder"] = {"variant": v.name, "node": v.node, "adapter": adapter} | held.pop(v.name)
        for d_consumed in v.consumes():
            if d_consumed[1] in counters:
                counters.remove(d_consumed[1])
    for node, r in sorted(seen.items()):
        for d in by_id.values():
            attached = (r.gpus if d["type"] == "gpu" else r.nics).get(str(d["identity"]))
            if attached is not None:
                d["attached"] = {"node": node, "adapter": attached, "busy": d["identity"] in r.busy}
    for name in counters:  # counted by the pool, offered nowhere
        by_id[name] = {
            "device": name,
            "type": None,
            "switch": None,
            "model": None,
            "identity": None,
            "reachable": [],
            "attached": None,
            "holder": None,
        }
    for name, h in sorted(held.items()):  # allocated variants no longer published
        by_id[name] = {
            "device": name,
            "type": None,
            "switch": None,
            "model": None,
            "identity": None,
            "reachable": [],
            "attached": None,
            "holder": {"variant": name} | h,
        }
    for d in by_id.values():
        d["state"] = "held" if d["holder"] else "free" if d["reachable"] else "withheld"
        b = (d["holder"] or {}).get("binding") or {}
        if b.get("state") == "failed":
            d["why"] = {
                "reason": b["reason"],
                "message": b["message"],
                "object": d["holder"]["claim"],
            }
        elif d["state"] != "free":
            last = newest(index.naming(d["device"]))
            d["why"] = (
                {
                    "reason": last.reason,
                    "message": last.message,
                    "object": last.object,
                    "time": last.time,
                }
                if last
                else None
            )
        else:
            d["why"] = None
    adapters = [
        {"node": n, "adapter": a, "pcieRoot": root}
        for n, r in sorted(seen.items())
        for a, root in sorted(r.adapters.items())
    ]
    return {
        "pool": pool,
        "devices": sorted(by_id.values(), key=lambda d: d["device"]),
        "adapters": adapters,
    }


def _state(d: Mapping[str, Any]) -> str:
    b = (d["holder"] or {}).get("binding")
    return f"held, {binding_text(b).split(':')[0]}" if b else d["state"]


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
        reach = ",".join(f"{r['node']}/{r['adapter']}" for r in d["reachable"]) or "-"
        h = d["holder"]
        claim = (h["claim"] + (f" pod {','.join(h['pods'])}" if h["pods"] else "")) if h else "-"
        why = f"{d['why']['reason']}: {d['why']['message']}" if d["why"] else ""
        if why and not wide and len(why) > 70:
            why = why[:69] + "…"
        row = [d["device"], d["type"] or "?", _state(d), attached, reach, claim, why]
        if wide:
            row[2:2] = [d["switch"] or "?", d["model"] or "?"]
        rows.append(row)
    text = table(head, rows)
    if view["adapters"]:
        text += "\n" + table(
            ["NODE", "ADAPTER", "PCIEROOT"],
            [[a["node"], a["adapter"], a["pcieRoot"]] for a in view["adapters"]],
        )
    return text
