"""``kubectl patchbay fabric``: the reach domains of the per-domain pool shape.

Why a module: under ``fabricPoolShape: per-domain`` the controller publishes
each fabric device (or a count-based manager's model slot) once, in a pool
per reach domain, ``<fabricPool>/<domain>`` (``<fabricPool>/<domain>/<8
hex>`` for devices some labelled Nodes do not reach), whose slices select
the Nodes labelled ``reach.fabric.patchbay.dev/<domain>`` and cut out by
name those labelled without reach (docs/fabric.md, "Pool shapes and reach
labels"); ready warm spares sit in ``<fabricPool>/spares/<node>``. An
operator asks: which pools are there, which Nodes does each offer its
devices to (the label, less the cut), and which devices are in it. This
reads the answer from the slices and the Nodes alone, as the scheduler
does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from driver.fabric_devices.naming import REACH_LABEL_PREFIX as LABEL_PREFIX
from driver.fabric_devices.naming import SPARE_POOLS as SPARES
from driver.fabric_devices.naming import is_adapter_pool
from driver.inspect.inventory import JsonObj


def is_domain_pool(name: str, pool: str) -> bool:
    """Whether ``name`` is one of ``pool``'s per-domain pools (not a spare pool,
    not a node's adapter pool)."""
    spare = name.startswith(f"{pool}/{SPARES}/")
    return name.startswith(pool + "/") and not spare and not is_adapter_pool(name, pool)


def _selected(selector: JsonObj, nodes: Iterable[JsonObj]) -> tuple[str, list[str], list[str]]:
    """(the reach label a domain slice selects, the Nodes it selects, the Nodes it cuts)."""
    label, cut = "", set()
    for term in ((selector.get("nodeSelector") or {}).get("nodeSelectorTerms")) or ():
        for e in term.get("matchExpressions") or ():
            if str(e.get("key", "")).startswith(LABEL_PREFIX) and e.get("operator") == "Exists":
                label = str(e["key"])
        for f in term.get("matchFields") or ():
            if f.get("key") == "metadata.name" and f.get("operator") == "NotIn":
                cut |= {str(v) for v in f.get("values") or ()}
    chosen = []
    for n in nodes:
        meta = n.get("metadata") or {}
        name = str(meta.get("name") or "")
        if label and label in (meta.get("labels") or {}) and name not in cut:
            chosen.append(name)
    return label, sorted(chosen), sorted(cut)


def domain_pools(slices: Iterable[JsonObj], nodes: Iterable[JsonObj], pool: str) -> list[Any]:
    """Per domain pool: its name, domain, reach label, the Nodes its slices
    select and those they cut out, and its devices (the fabric device ids,
    or slot ids of a count-based manager's slots), sorted."""
    nodes = list(nodes)
    out: dict[str, dict[str, Any]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        name = str((spec.get("pool") or {}).get("name") or "")
        if not is_domain_pool(name, pool):
            continue
        label, chosen, cut = _selected(spec, nodes)
        entry = out.setdefault(name, {
            "pool": name, "domain": name[len(pool) + 1 :].split("/")[0], "label": label,
            "nodes": chosen, "cut": cut, "devices": [],
        })  # fmt: skip
        for raw in spec.get("devices") or ():
            attrs = raw.get("attributes") or {}
            ident = attrs.get("fabricDevice") or attrs.get("fabricSlot") or {}
            entry["devices"].append(str(ident.get("string") or raw.get("name")))
    for entry in out.values():
        entry["devices"].sort()
    return [out[name] for name in sorted(out)]


def selected_nodes(domains: Iterable[Any]) -> dict[str, list[str]]:
    """Domain pool -> the Nodes its slices select."""
    return {d["pool"]: list(d["nodes"]) for d in domains}
