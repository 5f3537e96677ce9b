"""``kubectl patchbay leases``: who holds each claim, why, and until when.

Why: the first question an operator asks of a shared GPU (docs/leases.md).
A row per claim of ours that carries a device lease's annotations (the
holder recorded at admission, the reason, and once allocated the start and
expiry the controller stamped): namespace, name, holder, reason, devices,
started, expires (and how far off), the lease's state (``pending`` before
allocation, ``active``, ``expiring`` once warned, ``expired``, ``reclaimed`` when idle
devices were taken back, ``audited`` when it ended under audit mode) and, where the
node plugin marked a device ``Idle`` in the claim's ``status.devices``, since
when; ``-o wide`` adds each device's utilization as its node last reported
it there (``driver.idleterms.reading``: the node writes only when a device
turns idle or busy again, so a busy device never idle since it was
prepared, or one with no source, shows ``-``). Read from the claims alone
(``driver.leaseterms`` reads the annotations).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from driver import DRIVER_NAME
from driver.idleterms import IDLE, reading
from driver.inspect.claims import ours
from driver.inspect.inventory import JsonObj
from driver.inspect.table import table
from driver.leaseterms import STATES, format_duration, lease_of, stamp


def _idle_since(claim: JsonObj) -> str:
    """The earliest time a device of ours was marked ``Idle`` ("" when none is)."""
    since = [
        str(c.get("lastTransitionTime") or "")
        for e in (claim.get("status") or {}).get("devices") or ()
        if e.get("driver") == DRIVER_NAME
        for c in e.get("conditions") or ()
        if c.get("type") == IDLE and c.get("status") == "True"
    ]
    return min(since, default="")


def _utilization(claim: JsonObj) -> list[str]:
    """Per device of ours allocated to ``claim``, in order, what its ``Idle``
    condition last said of its utilization (``-``: nothing reported)."""
    status = claim.get("status") or {}
    entries = {
        (e.get("pool"), e.get("device"), e.get("shareID")): e
        for e in status.get("devices") or ()
        if e.get("driver") == DRIVER_NAME
    }
    out = []
    for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or ():
        if r.get("driver") != DRIVER_NAME:
            continue
        entry = entries.get((r.get("pool"), r.get("device"), r.get("shareID"))) or {}
        said = [reading(c) for c in entry.get("conditions") or ()]
        out.append(next((x for x in said if x is not None), "-"))
    return out


def leases_view(
    claims: Iterable[JsonObj], now: datetime, namespace: str | None = None
) -> list[dict[str, Any]]:
    """One entry per leased claim of ours (in ``namespace``, or every namespace)."""
    out = []
    for c in claims:
        lease = lease_of(c)
        if not ours(c) or not (lease.holder or lease.start is not None):
            continue
        if namespace is not None and lease.namespace != namespace:
            continue
        status = c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        state = STATES.get(lease.phase, "active")
        out.append({
            "namespace": lease.namespace,
            "name": lease.name,
            "holder": lease.holder,
            "reason": lease.reason,
            "devices": [f"{r.get('pool')}/{r.get('device')}" for r in results
                        if r.get("driver") == DRIVER_NAME],
            "started": stamp(lease.start) if lease.start is not None else "",
            "expires": stamp(lease.expiry) if lease.expiry is not None else "",
            "secondsLeft": lease.expiry - now.timestamp() if lease.expiry is not None else None,
            "extended": format_duration(lease.extended) if lease.extended else "",
            "state": state if lease.start is not None or lease.phase else "pending",
            "idleSince": _idle_since(c),
            "utilization": _utilization(c),
        })  # fmt: skip
    out.sort(key=lambda v: (v["namespace"], v["name"]))
    return out


def _left(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"in {format_duration(seconds)}" if seconds >= 0 else f"{format_duration(-seconds)} ago"


def render_leases(
    views: Iterable[Mapping[str, Any]], wide: bool = False, all_ns: bool = True
) -> str:
    """The table: one line per claim (``-o wide`` adds the start, extension,
    full reason and the devices' utilization as last reported)."""
    head = (["NAMESPACE"] if all_ns else []) + ["NAME", "HOLDER", "REASON", "DEVICES", "STATE"]
    head += ["STARTED", "EXPIRES", "EXTENDED", "IDLE SINCE"] if wide else ["EXPIRES", "IDLE SINCE"]
    head += ["UTILIZATION"] if wide else []
    rows = []
    for v in views:
        reason = v["reason"] if wide or len(v["reason"]) <= 40 else v["reason"][:39] + "…"
        row = ([v["namespace"]] if all_ns else []) + [v["name"], v["holder"] or "?", reason]
        row += [",".join(v["devices"]) or "<none>", v["state"]]
        expires = f"{v['expires']} ({_left(v['secondsLeft'])})" if v["expires"] else ""
        row += [v["started"], expires, v["extended"]] if wide else [expires]
        row.append(v["idleSince"])
        rows.append([*row, ",".join(v["utilization"]) or "-"] if wide else row)
    return table(head, rows)
