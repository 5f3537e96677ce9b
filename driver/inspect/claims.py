"""``kubectl patchbay claims``: each claim with its devices, binding state and last error.

A row per ResourceClaim that asks for (or holds) our devices: its state
(``pending`` without an allocation, ``allocated``, ``reserved`` once pods
reserve it), node, pods, and per allocated device its pool and, for a
device with binding conditions (a fabric variant), the binding state the
scheduler waits on: ``attaching`` with how long since
``allocation.allocationTimestamp``, ``ready`` once every binding condition
is ``True`` in ``status.devices[].conditions`` (with how long it took),
``failed`` with the failure condition's reason and message. The last error
is the newest error Event (:mod:`.events`) about the claim or its pods;
the pods are ``status.reservedFor``, or the claim's owner pod (a claim made
from a template) when nothing reserves it, so the error that cleared an
allocation stays visible. A claim reserved for a PodGroup (KEP-5729) names
the group, not its pods: ``podGroups``, shown as ``podgroup/<name>`` in the
PODS column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from driver import DRIVER_NAME
from driver.inspect.events import EventIndex, newest, parse_time
from driver.inspect.inventory import JsonObj, build
from driver.inspect.table import table
from driver.kube.reservations import allocated_node, reserved_for

DEVICE_CLASS_SUFFIX = f".{DRIVER_NAME}"


def _true(entry: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next(
        (
            c
            for c in entry.get("conditions") or ()
            if c.get("type") == kind and c.get("status") == "True"
        ),
        None,
    )


def binding(result: JsonObj, entry: JsonObj, allocated: str, now: datetime) -> dict[str, Any]:
    """The binding state of one allocation result with binding conditions."""
    start = parse_time(allocated)
    for kind in result.get("bindingFailureConditions") or ():
        if (c := _true(entry, kind)) is not None:
            return {
                "state": "failed",
                "condition": kind,
                "reason": c.get("reason", ""),
                "message": c.get("message", ""),
            }
    ready = [_true(entry, k) for k in result.get("bindingConditions") or ()]
    if all(ready):
        times = [t for c in ready if c and (t := parse_time(c.get("lastTransitionTime")))]
        done = max(times, default=None)
        took = (done - start).total_seconds() if done and start else None
        return {"state": "ready", "seconds": took}
    return {"state": "attaching", "seconds": (now - start).total_seconds() if start else None}


def ours(claim: JsonObj) -> bool:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    if any(r.get("driver") == DRIVER_NAME for r in results.get("results") or ()):
        return True
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        options = [req.get("exactly") or {}, *(req.get("firstAvailable") or ())]
        if any(str(o.get("deviceClassName", "")).endswith(DEVICE_CLASS_SUFFIX) for o in options):
            return True
    return False


def _pods(claim: JsonObj) -> list[str]:
    meta = claim.get("metadata") or {}
    reserved = list(reserved_for(claim).pods)
    owners = [str(o["name"]) for o in meta.get("ownerReferences") or () if o.get("kind") == "Pod"]
    return reserved or owners


def claims_view(
    slices: Iterable[JsonObj],
    claims: Iterable[JsonObj],
    events: Iterable[JsonObj],
    now: datetime,
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    """One entry per claim of ours (in ``namespace``, or every namespace)."""
    claims = [c for c in claims if ours(c)]
    inv = build(slices, claims)
    where = {(d.pool, d.name): d for d in inv.devices}
    index = EventIndex(events)
    out = []
    for c in claims:
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if namespace is not None and ns != namespace:
            continue
        allocation = status.get("allocation") or {}
        entries = {(e.get("pool"), e.get("device")): e for e in status.get("devices") or ()}
        devices, nodes = [], set()
        for r in (allocation.get("devices") or {}).get("results") or ():
            if r.get("driver") != DRIVER_NAME:
                continue
            dev = where.get((str(r.get("pool")), str(r.get("device"))))
            d: dict[str, Any] = {
                "request": r.get("request"),
                "pool": r.get("pool"),
                "device": r.get("device"),
                "type": dev.type if dev else "?",
            }
            # A device published without a node (a per-domain fabric pool's): the
            # node the allocation is bound to.
            nodes.add(dev.node if dev is not None and dev.node else allocated_node(allocation))
            if r.get("bindingConditions"):
                entry = entries.get((r.get("pool"), r.get("device"))) or {}
                d["binding"] = binding(
                    r, entry, str(allocation.get("allocationTimestamp", "")), now
                )
            devices.append(d)
        pods, groups = _pods(c), list(reserved_for(c).pod_groups)
        errors = index.about("Pod", ns, pods) + index.about("ResourceClaim", ns, [name])
        last = newest(errors)
        state = (
            "pending"
            if not allocation
            else "reserved"
            if status.get("reservedFor")
            else "allocated"
        )
        out.append(
            {
                "namespace": ns,
                "name": name,
                "state": state,
                "node": ",".join(sorted(nodes - {""})),
                "pods": pods,
                "podGroups": groups,
                "devices": devices,
                "lastError": last.as_dict() if last else None,
            }
        )
    out.sort(key=lambda v: (v["namespace"], v["name"]))
    return out


def _seconds(s: float | None) -> str:
    if s is None:
        return "?"
    s = max(0, round(s))
    return f"{s}s" if s < 120 else f"{s // 60}m{s % 60:02d}s"


def binding_text(b: Mapping[str, Any], wide: bool = True) -> str:
    """``attaching 12s``, ``ready (3s)``, ``failed <reason>`` (``: <message>`` if wide)."""
    if b["state"] == "failed":
        return f"failed {b['reason']}" + (f": {b['message']}" if wide else "")
    if b["state"] == "ready":
        return f"ready ({_seconds(b['seconds'])})"
    return f"attaching {_seconds(b['seconds'])}"


def render_claims(
    views: Iterable[Mapping[str, Any]], wide: bool = False, all_ns: bool = True
) -> str:
    """The table: one line per device (the claim's columns on its first line)."""
    head = (["NAMESPACE"] if all_ns else []) + ["NAME", "STATE", "NODE", "DEVICE", "BINDING"]
    head += ["PODS", "LAST ERROR"] if wide else ["LAST ERROR"]
    rows = []
    for v in views:
        err = v["lastError"]
        text = f"{err['reason']}: {err['message']}" if err else ""
        if err and not wide and len(text) > 60:
            text = text[:59] + "…"
        devs = v["devices"] or [{}]
        for i, d in enumerate(devs):
            first = i == 0
            row = ([v["namespace"]] if all_ns else []) + [v["name"] if first else ""]
            row += [v["state"] if first else "", v["node"] if first else ""]
            row += [f"{d['pool']}/{d['device']}" if d else "<none>"]
            row += [binding_text(d["binding"], wide) if "binding" in d else ""]
            holders = [*v["pods"], *(f"podgroup/{g}" for g in v.get("podGroups", ()))]
            row += [",".join(holders) if first else ""] if wide else []
            row += [text if first else ""]
            rows.append(row)
    return table(head, rows)
