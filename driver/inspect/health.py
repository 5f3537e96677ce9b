"""The GPU health part of ``kubectl patchbay nodes``: per GPU that failed, its
state, class, reason, resets within the limit's window, and its recent steps.

Why: the Events that tell a GPU's recovery expire; the node plugin keeps
the story in its Node's ``patchbay.dev/health`` annotation
(:mod:`driver.health.history`), and this view shows it beside the node's
devices. A GPU is named as its node publishes it (the device whose ``uuid``
attribute is the GPU's), by UUID when nothing names it. Resets are counted
within the window at the time of the view (the annotation holds when each
happened, so it need not be rewritten as they age out). Pure functions on
recorded objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from driver.health.history import GpuHistory, NodeHealth
from driver.health.records import ENDED
from driver.inspect.events import parse_time
from driver.inspect.inventory import USED, Dev

NOTE_CUT = 60  # characters of a step's note in the text (``-o wide``: all)


def _names(devs: Iterable[Dev]) -> dict[str, str]:
    """GPU UUID -> the device name the node publishes it as: a local GPU,
    else an allocated fabric variant (reachable from several adapters)."""
    out: dict[str, str] = {}
    for d in sorted(devs, key=lambda d: (d.fabric, d.state != USED, d.name)):
        uuid = d.attr("uuid")
        if d.type == "gpu" and isinstance(uuid, str) and (not d.fabric or d.state == USED):
            out.setdefault(uuid, d.name)
    return out


def _used(g: GpuHistory, window: float, now: datetime) -> int:
    times = (parse_time(t) for t in g.resets)
    return sum(1 for t in times if t is not None and (now - t).total_seconds() < window)


def health_view(node: Mapping[str, Any] | None, devs: Iterable[Dev], now: datetime) -> list[Any]:
    """One entry per GPU the node's health annotation names, by device name."""
    health = NodeHealth.from_node(node) if node is not None else None
    if health is None:
        return []
    names = _names(devs)
    rows = []
    for uuid, g in health.gpus.items():
        row: dict[str, Any] = {"gpu": names.get(uuid, ""), "uuid": uuid, "state": g.state}
        if g.state not in ENDED:
            row |= {"class": g.failure_class, "xid": g.xid, "reason": g.reason, "since": g.since}
        row |= {
            "resets": _used(g, health.reset_window, now),
            "resetLimit": health.reset_limit,
            "resetWindow": int(health.reset_window),
            "transitions": [
                {"time": t, "state": state, "step": step, "note": note}
                for t, state, step, note in g.steps
            ],
        }
        rows.append(row)
    rows.sort(key=lambda r: (r["gpu"] == "", r["gpu"], r["uuid"]))
    return rows


def span(seconds: int) -> str:
    """``86400`` -> ``1d``; the largest unit that divides it evenly."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def render_health(rows: Iterable[Mapping[str, Any]], wide: bool = False) -> list[str]:
    """Per GPU a state line, then a line per transition (time, state, step, note)."""
    lines = []
    for r in rows:
        state = r["state"]
        if state not in ENDED:
            why = f"{r['class']} class, XID {r['xid']}"
            why += f": {r['reason']}" if r["reason"] else ""
            state += f" ({why}) since {r['since']}"
        resets = f"resets {r['resets']}/{r['resetLimit']} in {span(r['resetWindow'])}"
        lines.append(f"  health     {r['gpu'] or r['uuid']}: {state}, {resets}")
        width = max((len(t["step"]) for t in r["transitions"]), default=0)
        for t in r["transitions"]:
            note = t["note"] if wide or len(t["note"]) <= NOTE_CUT else t["note"][:NOTE_CUT] + "…"
            cells = f"{t['time']}  {t['state'] or '-':<9}  {t['step']:<{width}}  {note}"
            lines.append(f"{'':13}{cells.rstrip()}")
    return lines
