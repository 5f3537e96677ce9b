"""``kubectl patchbay nodes``: per node, devices by type, MIG bars, taints, fabric,
and the health of its GPUs that failed (:mod:`.health`).

A GPU's MIG geometry is drawn as its eight memory slots: every allocated
partition is ``[<profile>··]``, two characters per slot it spans (the
profile's name fills the first), and a free slot is ``··`` outside any
bracket, so a GPU with a 3g at slot 0 and two 1g at 5 and 6 reads
``[3g······]··[1g][1g]··``. Which slots a partition spans comes from its
``consumesCounters``: the counters ``mem0``..``mem7`` of its GPU's set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from driver.inspect.health import health_view, render_health
from driver.inspect.inventory import FREE, USED, Dev, Inventory, JsonObj, build

# Device types counted per node, with their column heads.
TYPES = {"gpu": "GPU", "mig": "MIG", "vf": "VF", "nvme": "NVME", "cxlmem": "CXLMEM"}
SLOTS = 8
_SLOT = re.compile(r"^mem(\d+)$")


def slots_of(dev: Dev) -> list[int]:
    """Memory slots a device consumes, from its ``memN`` counters."""
    return sorted(int(m.group(1)) for _, c, _ in dev.consumes() if (m := _SLOT.match(c)))


def counter_sets(dev: Dev) -> set[str]:
    return {cs for cs, _, _ in dev.consumes()}


def mig_bar(gpu: Dev, migs: Iterable[Dev]) -> str:
    """The eight-slot bar of ``gpu`` given the MIG devices of its counter set."""
    if gpu.state == USED:
        return "[gpu" + "··" * (SLOTS - 1) + "]"
    owner: list[Dev | None] = [None] * SLOTS
    for m in migs:
        if m.state == USED:
            for s in slots_of(m):
                if 0 <= s < SLOTS:
                    owner[s] = m
    out, s = [], 0
    while s < SLOTS:
        held = owner[s]
        if held is None:
            out.append("··")
            s += 1
            continue
        width = sum(1 for o in owner[s:] if o is held)
        label = str(held.attr("profile") or "mig").split(".")[0][:2]
        out.append(f"[{label}{'··' * (width - 1)}]")
        s += width
    return "".join(out)


def _holder(d: Dev) -> dict[str, Any]:
    if d.holder is None:
        return {}
    return {"claim": d.holder.claim, "pods": list(d.holder.pods)}


def _gpu_view(gpu: Dev, local: list[Dev]) -> dict[str, Any] | None:
    sets = counter_sets(gpu)
    if not slots_of(gpu):
        return None
    migs = [d for d in local if d.type == "mig" and counter_sets(d) & sets]
    parts = [
        {"device": m.name, "profile": m.attr("profile"), "slots": slots_of(m), **_holder(m)}
        for m in migs
        if m.state == USED
    ]
    parts.sort(key=lambda p: p["slots"][:1])
    view = {"gpu": gpu.name, "bar": mig_bar(gpu, migs), "partitions": parts}
    return view | ({"whole": _holder(gpu)} if gpu.state == USED else {})


def node_view(
    inv: Inventory, node: str, obj: JsonObj | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The view of ``node``; ``obj`` is its Node object (its health annotation)."""
    devs = inv.on_node(node)
    local = [d for d in devs if not d.fabric]
    counts = {}
    for t in TYPES:
        of_type = [d for d in local if d.type == t]
        used = sum(d.state == USED for d in of_type)
        free = sum(d.state == FREE for d in of_type)
        counts[t] = {"total": len(of_type), "used": used, "free": free}
    gpus = sorted(
        (g for g in local if g.type == "gpu"), key=lambda g: (str(g.attr("index")), g.name)
    )
    mig = [v for g in gpus if (v := _gpu_view(g, local)) is not None]
    tainted = [
        {"device": d.name, "taints": [_taint(t) for t in d.taints]} for d in local if d.taints
    ]
    fabric = [
        {"device": d.name, "type": d.type, "pool": d.pool, **_holder(d)}
        for d in devs
        if d.fabric and d.state == USED
    ]
    health = health_view(obj, devs, now or datetime.now(UTC))
    view = {"node": node, "devices": counts, "mig": mig, "tainted": tainted, "fabric": fabric}
    return view | {"health": health}


def _taint(t: JsonObj) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def nodes_view(
    slices: Iterable[JsonObj],
    claims: Iterable[JsonObj],
    nodes: Iterable[JsonObj] = (),
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    inv = build(slices, claims)
    objs = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    return [
        node_view(inv, n, objs.get(n), now)
        for n in inv.nodes()
        if any(not d.fabric for d in inv.on_node(n))
    ]


def render_nodes(views: Iterable[dict[str, Any]], wide: bool = False) -> str:
    """The text table: a summary line per node, then its GPUs, taints, fabric."""
    views = list(views)
    shown = [t for t in TYPES if t in ("gpu", "mig", "vf") or any(
        v["devices"][t]["total"] for v in views)]  # fmt: skip
    lines = [f"{'NODE':<24} " + " ".join(f"{TYPES[t]:>11}" for t in shown) + "  (used/free/total)"]
    for v in views:
        cells = [
            f"{c['used']}/{c['free']}/{c['total']}" for t, c in v["devices"].items() if t in shown
        ]
        lines.append(f"{v['node']:<24} " + " ".join(f"{c:>11}" for c in cells))
        for g in v["mig"]:
            line = f"  {g['gpu']:<10} {g['bar']}"
            if wide:
                parts = g["partitions"]
                held = [f"{p['profile']}@{p['slots'][0]} {p.get('claim', '')}" for p in parts]
                held += [f"whole {g['whole'].get('claim', '')}"] if "whole" in g else []
                line += ("   " + ", ".join(held)) if held else ""
            lines.append(line)
        for t in v["tainted"]:
            lines.append(f"  tainted    {t['device']}: {', '.join(t['taints'])}")
        for f in v["fabric"]:
            extra = f" {f.get('claim', '')}" if wide else ""
            lines.append(f"  fabric     {f['device']} ({f['type']}){extra}")
        lines += render_health(v.get("health") or (), wide=wide)
    return "\n".join(lines) + "\n"
