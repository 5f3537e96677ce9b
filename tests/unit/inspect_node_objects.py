"""Recorded API objects of one node's local pool for the ``kubectl patchbay``
views: its slice (whole GPUs, MIG devices with their counters, VFs),
claims allocating them, and device attributes as the apiserver stores them.

Why: the nodes, topology, claims and SVG views are tested on the same
objects; they live here once (the fabric's are in inspect_objects.py)."""

from __future__ import annotations

from typing import Any

NODE = "node-a"
JsonObj = dict[str, Any]


def attrs(**values: Any) -> JsonObj:
    out: JsonObj = {}
    for key, value in values.items():
        key = {"pcieRoot": "resource.kubernetes.io/pcieRoot",
               "numaNode": "resource.kubernetes.io/numaNode"}.get(key, key)  # fmt: skip
        kind = "int" if isinstance(value, int) else "string"
        out[key] = {kind: value}
    return out


def counters(cset: str, *names: str) -> list[JsonObj]:
    return [{"counterSet": cset, "counters": {n: {"value": "1"} for n in names}}]


def gpu(index: int, root: str = "pci0000:3a", numa: int = 0) -> JsonObj:
    slots = [f"mem{s}" for s in range(8)]
    return {
        "name": f"gpu-{index}",
        "attributes": attrs(
            type="gpu", uuid=f"GPU-{index}", index=index, pcieRoot=root, numaNode=numa
        ),
        "consumesCounters": counters(f"gpu-{index}-mig", *slots),
    }


def mig(index: int, profile: str, start: int, slots: int) -> JsonObj:
    mem = [f"mem{s}" for s in range(start, start + slots)]
    slug = profile.replace(".", "-")
    return {
        "name": f"gpu-{index}-mig-{slug}-{start}",
        "attributes": attrs(
            type="mig",
            profile=profile,
            pcieRoot="pci0000:3a",
            numaNode=0,
        ),
        "consumesCounters": counters(f"gpu-{index}-mig", *mem),
    }


def vf(name: str, root: str, numa: int, pf: str = "ens1f0") -> JsonObj:
    a = attrs(type="vf", pfName=pf, pfPciBusID=f"{root[3:]}:00.0", pcieRoot=root, numaNode=numa)
    return {"name": name, "attributes": a}


def local_slice(devices: list[JsonObj], shared: list[JsonObj] | None = None) -> JsonObj:
    spec: JsonObj = {"driver": "patchbay.dev", "nodeName": NODE, "pool": {"name": NODE}}
    spec |= {"devices": devices} if shared is None else {"sharedCounters": shared}
    return {"metadata": {"name": f"{NODE}-{len(devices)}"}, "spec": spec}


def counter_set(index: int) -> JsonObj:
    return {"name": f"gpu-{index}-mig", "counters": {f"mem{s}": {"value": "1"} for s in range(8)}}


def claim(name: str, *devices: str, pod: str | None = None) -> JsonObj:
    results = [{"request": "dev", "driver": "patchbay.dev", "pool": NODE, "device": d}
               for d in devices]  # fmt: skip
    status: JsonObj = {"allocation": {"devices": {"results": results}}}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": "u"}]
    return {"metadata": {"namespace": "team", "name": name}, "status": status}


def mig_cluster() -> tuple[list[JsonObj], list[JsonObj]]:
    placements = [("1g.10gb", s, 1) for s in range(7)] + [("3g.40gb", s, 4) for s in (0, 4)]
    devices = [gpu(0), gpu(1)] + [mig(0, p, s, n) for p, s, n in placements]
    devices.append(vf("vf-0", "pci0000:3a", 0))
    slices = [local_slice([], [counter_set(0), counter_set(1)]), local_slice(devices)]
    claims = [
        claim("big", "gpu-0-mig-3g-40gb-0", pod="train"),
        claim("small-a", "gpu-0-mig-1g-10gb-6"),
        claim("small-b", "gpu-0-mig-1g-10gb-5"),
    ]
    return slices, claims
