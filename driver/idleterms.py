"""The ``Idle`` device condition: what the node writes, what the controller reads.

Why one module: the node plugin writes ``Idle`` in a claim's
``status.devices`` entries (``driver.idle``) and the controller acts on it
under a DeviceLeasePolicy (``driver.controller.leases``); ``kubectl
patchbay leases`` shows it. The condition's type, its reasons and the
message of an ``Idle=True`` live here, because that message carries the two
facts the controller needs and a condition has no other field for them: the
node's threshold (the device stayed below it) and since when (the wall
time its low stretch began, which is earlier than the condition's
``lastTransitionTime`` by the node's window). The writer and the reader of
the message are kept side by side so they cannot drift. Pure functions.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver import DRIVER_NAME

IDLE = "Idle"  # the condition type
BELOW_THRESHOLD, BUSY, UNKNOWN = "BelowThreshold", "Busy", "UtilizationUnknown"  # reasons

_MESSAGE = re.compile(r"utilization below ([0-9]+(?:\.[0-9]+)?)% for [0-9.e+]+s, since (\S+)")
_BUSY = re.compile(r"utilization ([0-9]+)% \(threshold")


def idle_message(threshold: float, window: float, since: str, highest: float) -> str:
    """The message of an ``Idle=True`` (``since`` an RFC 3339 UTC stamp)."""
    return (f"utilization below {threshold:g}% for {window:g}s, since {since}"
            f" (highest {highest:.0f}%)")  # fmt: skip


def busy_message(latest: float, threshold: float) -> str:
    """The message of an ``Idle=False`` (``Busy``): the reading that ended the stretch."""
    return f"utilization {latest:.0f}% (threshold {threshold:g}%)"


def reading(cond: Mapping[str, Any]) -> str | None:
    """What an ``Idle`` condition says of the device's utilization, as the node
    last reported it (it writes only when the verdict changes): ``<5%``
    (below its threshold, idle), ``37%`` (the reading that turned it busy
    again), ``unknown``; None for another condition."""
    if cond.get("type") != IDLE:
        return None
    message = str(cond.get("message") or "")
    if cond.get("status") == "True":
        found = _MESSAGE.match(message)
        return f"<{float(found.group(1)):g}%" if found else "idle"
    if cond.get("reason") == UNKNOWN:
        return "unknown"
    busy = _BUSY.match(message)
    return f"{busy.group(1)}%" if busy else "busy"


def _seconds(text: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class IdleReport:
    """One device's ``Idle=True``: the node's threshold (None: its message does
    not say) and since when the device has been below it (wall seconds)."""

    device: str
    threshold: float | None
    since: float


def report_of(device: str, cond: Mapping[str, Any]) -> IdleReport | None:
    """``cond``'s report when it is an ``Idle=True`` with a readable time."""
    if cond.get("type") != IDLE or cond.get("status") != "True":
        return None
    changed = _seconds(str(cond.get("lastTransitionTime") or ""))
    found = _MESSAGE.match(str(cond.get("message") or ""))
    since = _seconds(found.group(2)) if found else None
    if since is None:  # not our message: the report itself is the earliest we know
        since = changed
    if since is None:
        return None
    return IdleReport(device, float(found.group(1)) if found else None, since)


def idle_reports(claim: Mapping[str, Any]) -> list[IdleReport] | None:
    """The ``Idle=True`` report of every device of ours allocated to ``claim``,
    or None unless each one has one (a device with no report, an unknown or
    a busy one is not idle, and so neither is its claim). A claim with no
    device of ours is not idle."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
    ours = [r for r in results if r.get("driver") == DRIVER_NAME]
    if not ours:
        return None
    entries = {
        (e.get("pool"), e.get("device"), e.get("shareID")): e
        for e in status.get("devices") or ()
        if e.get("driver") == DRIVER_NAME
    }
    out = []
    for r in ours:
        entry = entries.get((r.get("pool"), r.get("device"), r.get("shareID")))
        name = f"{r.get('pool')}/{r.get('device')}"
        found = [report_of(name, c) for c in (entry or {}).get("conditions") or ()]
        report = next((f for f in found if f is not None), None)
        if report is None:
            return None
        out.append(report)
    return out
