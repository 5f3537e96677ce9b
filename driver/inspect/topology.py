"""``kubectl patchbay topology NODE``: the PCIe tree of one node.

Roots (``resource.kubernetes.io/pcieRoot``) grouped by NUMA node; under
each root its GPUs (with their allocated MIG slices) and its NICs, a NIC
being the PF its VFs name (``pfName`` / ``pfPciBusID``). Every device shows
its state and, when allocated, the claim and the pods reserving it. A root
holding a free GPU and a free VF is marked ``pairable``: a GPU+VF request
pair with ``matchAttribute: pcieRoot`` can land there now. Fabric devices
attached to the node sit under the adapter's root, as the node sees them.
``-o wide`` adds each device's PCI bus ID.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from driver.inspect.inventory import FREE, NUMA_NODE, PCIE_ROOT, USED, Dev, JsonObj, build

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def _entry(d: Dev) -> dict[str, Any]:
    out: dict[str, Any] = {"device": d.name, "type": d.type, "state": d.state}
    if d.attr(PCI_BUS_ID):
        out["pciBusID"] = d.attr(PCI_BUS_ID)
    if d.fabric:
        out["attachment"] = "fabric"
    if d.holder is not None:
        out |= {"claim": d.holder.claim, "pods": list(d.holder.pods)}
    return out


def _sets(d: Dev) -> set[str]:
    return {cs for cs, _, _ in d.consumes()}


def topology_view(
    slices: Iterable[JsonObj], claims: Iterable[JsonObj], node: str
) -> dict[str, Any]:
    """The tree of ``node`` as plain data (``-o json|yaml`` prints this)."""
    devs = [
        d
        for d in build(slices, claims).on_node(node)
        if d.type in ("gpu", "mig", "vf", "nvme", "cxlmem") and (not d.fabric or d.state == USED)
    ]
    roots: dict[str, dict[str, Any]] = {}
    for d in sorted(devs, key=lambda d: d.name):
        root_name = str(d.attr(PCIE_ROOT) or "(no pcieRoot)")
        root = roots.setdefault(
            root_name,
            {
                "pcieRoot": root_name,
                "numaNode": d.attr(NUMA_NODE),
                "gpus": [],
                "nics": {},
                "nvme": [],
                "cxlmem": [],
            },
        )
        if d.type == "gpu":
            root["gpus"].append(_entry(d) | {"mig": []})
        elif d.type in ("nvme", "cxlmem"):
            root[d.type].append(_entry(d))
        elif d.type == "vf":
            pf = str(d.attr("pfName") or "?")
            nic = root["nics"].setdefault(
                pf, {"pf": pf, "pfPciBusID": d.attr("pfPciBusID"), "vfs": []}
            )
            nic["vfs"].append(_entry(d))
    for d in devs:
        if d.type == "mig" and d.state == USED:
            found = roots.get(str(d.attr(PCIE_ROOT)))
            for g in found["gpus"] if found else []:
                gdev = next(x for x in devs if x.name == g["device"])
                if _sets(gdev) & _sets(d):  # the GPU's counter set is its partitions'
                    g["mig"].append(_entry(d) | {"profile": d.attr("profile")})
                    break
    out = []
    for r in roots.values():
        r["nics"] = list(r["nics"].values())
        free_gpu = any(g["state"] == FREE for g in r["gpus"])
        free_vf = any(v["state"] == FREE for n in r["nics"] for v in n["vfs"])
        r["pairable"] = free_gpu and free_vf
        out.append(r)
    out.sort(key=lambda r: (r["numaNode"] is None, r["numaNode"] or 0, r["pcieRoot"]))
    return {"node": node, "roots": out}


def _line(e: dict[str, Any], wide: bool) -> str:
    text = f"{e['device']} {e['state']}"
    if wide and e.get("pciBusID"):
        text = f"{e['device']} [{e['pciBusID']}] {e['state']}"
    if e.get("attachment"):
        text += " (fabric)"
    if "claim" in e:
        text += f" {e['claim']}"
        if e["pods"]:
            text += f" pod {','.join(e['pods'])}"
    return text


def render_topology(view: dict[str, Any], wide: bool = False) -> str:
    lines = [f"node {view['node']}"]
    numa: object = object()
    for r in view["roots"]:
        if r["numaNode"] != numa:
            numa = r["numaNode"]
            lines.append(f"  numa {numa if numa is not None else '?'}")
        mark = "  [pairable: free GPU + free VF]" if r["pairable"] else ""
        lines.append(f"    {r['pcieRoot']}{mark}")
        for g in r["gpus"]:
            lines.append(f"      gpu {_line(g, wide)}")
            lines.extend(f"        mig {m['profile']} {_line(m, wide)}" for m in g["mig"])
        for n in r["nics"]:
            bdf = f" ({n['pfPciBusID']})" if n["pfPciBusID"] else ""
            lines.append(f"      nic {n['pf']}{bdf}")
            lines.extend(f"        vf {_line(v, wide)}" for v in n["vfs"])
        lines.extend(f"      nvme {_line(e, wide)}" for e in r["nvme"])
        lines.extend(f"      cxl-memory {_line(e, wide)}" for e in r["cxlmem"])
    return "\n".join(lines) + "\n"
