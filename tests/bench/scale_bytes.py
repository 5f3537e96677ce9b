"""Where a MIG node's slice bytes go: the input for leaner slices (issue 26).

Why: at 5000 nodes our slices approach a gigabyte in etcd and in every
informer cache, and most of it is dynamic MIG's placements. Before cutting
bytes we measure them without a cluster, so that a unit test can hold the
figure: :func:`bytes_per_mig_gpu` is the compact JSON of a 4 x H100 node's
slices (dynamic MIG only, the plugin's own builder, ``scale_pool``) per
MIG-capable GPU; the apiserver adds metadata and managed fields on top
(``scale_bench`` prints bytes as served). :func:`byte_report` splits the
device bytes by what they carry: attributes every placement of a GPU
repeats, attributes that differ per placement, names, capacities, counter
consumptions, the counter sets, and the rest of the slice.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from tests.bench.mig_shape_v1 import old_shape
from tests.bench.scale_pool import MIG_ONLY, HostPools

Obj = dict[str, Any]
NODE: Obj = {"metadata": {"name": "node-0000", "uid": "5f0c1f39-62b6-4f5e-9d8e-000000000000"}}


def size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def field_bytes(key: str, value: Any) -> int:
    """Bytes of ``"key":value,`` inside a JSON object."""
    return size(key) + 1 + size(value) + 1


def mig_slices(pools: HostPools) -> list[Obj]:
    return pools.slices(NODE, MIG_ONLY)


def bytes_per_mig_gpu(pools: HostPools) -> float:
    """Compact JSON bytes of a dynamic-MIG node's slices per MIG-capable GPU."""
    slices = mig_slices(pools)
    gpus = sum(
        1
        for s in slices
        for d in s["spec"].get("devices") or []
        if d["attributes"]["type"] == {"string": "gpu"}
    )
    return sum(size(s) for s in slices) / max(gpus, 1)


PARTS = {"name": "device names", "capacity": "capacity",
         "consumesCounters": "counter consumptions"}  # fmt: skip


def gpu_of(device: Obj) -> str | None:
    """A MIG placement's GPU: its counter set (``gpu-<index>-mig``); None for
    a full GPU (which consumes the same set) and for anything else."""
    if device["attributes"]["type"] != {"string": "mig"}:
        return None
    return str(device["consumesCounters"][0]["counterSet"])


def breakdown(slices: list[Obj]) -> dict[str, int]:
    """Bytes by what they carry, over every slice of one node."""
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    by_gpu: dict[str, list[Obj]] = defaultdict(list)
    for d in devices:
        if (gpu := gpu_of(d)) is not None:
            by_gpu[gpu].append(d)
    repeated: set[tuple[str, str]] = set()  # (parent, attribute) the same on all its placements
    for gpu, group in by_gpu.items():
        for key in group[0]["attributes"]:
            if all(g["attributes"].get(key) == group[0]["attributes"][key] for g in group):
                repeated.add((gpu, key))
    out: Counter[str] = Counter()
    for d in devices:
        parent = gpu_of(d)
        for key, value in d["attributes"].items():
            if parent is None:
                part = "attributes of full GPUs"
            elif (parent, key) in repeated:
                part = "attributes every placement of a GPU repeats"
            else:
                part = "attributes that differ per placement"
            out[part] += field_bytes(key, value)
        counted = 0
        for key, part in PARTS.items():
            if key in d:
                out[part] += field_bytes(key, d[key])
                counted += field_bytes(key, d[key])
        attrs = sum(field_bytes(k, v) for k, v in d["attributes"].items())
        out["device framing, other fields"] += size(d) - counted - attrs
    for s in slices:
        if "sharedCounters" in s["spec"]:
            out["counter sets"] += field_bytes("sharedCounters", s["spec"]["sharedCounters"])
        counters = field_bytes("sharedCounters", s["spec"].get("sharedCounters"))
        inside = sum(size(d) for d in s["spec"].get("devices") or [])
        if "sharedCounters" not in s["spec"]:
            counters = 0
        out["slice metadata, pool, driver, node"] += size(s) - inside - counters
    return dict(out)


def repeated_attributes(slices: list[Obj]) -> dict[str, int]:
    """Bytes per attribute name over the MIG devices (what a lean slice could say once)."""
    out: Counter[str] = Counter()
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["attributes"]["type"] == {"string": "mig"}:
                for key, value in d["attributes"].items():
                    out[key] += field_bytes(key, value)
    return dict(out)


def placements(slices: list[Obj]) -> dict[str, int]:
    """MIG devices offered per profile on one GPU (the placement set)."""
    counts: Counter[str] = Counter()
    first = None
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if (gpu := gpu_of(d)) is not None:
                first = first or gpu
                if gpu == first:
                    counts[d["attributes"]["profile"]["string"]] += 1
    return dict(counts)


def before_after(pools: HostPools) -> tuple[float, float]:
    """Bytes per MIG-capable GPU of the shape before issue 26
    (``mig_shape_v1``) and of the shape the plugin publishes now."""
    with old_shape():
        before = bytes_per_mig_gpu(pools)
    return before, bytes_per_mig_gpu(pools)


def byte_report(pools: HostPools) -> str:
    slices = mig_slices(pools)
    total = sum(size(s) for s in slices)
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    before, after = before_after(pools)
    lines = [
        f"slice bytes, 4 x H100 with dynamic MIG only (compact JSON as built, before the "
        f"apiserver's metadata): {len(slices)} slices, {devices} devices, {total / 1e3:.1f} kB, "
        f"{bytes_per_mig_gpu(pools):.0f} bytes per MIG-capable GPU, "
        f"{total / devices:.0f} per device",
        f"  per MIG-capable GPU: before (the shape up to issue 26, mig_shape_v1) {before:.0f} "
        f"bytes, after {after:.0f} bytes ({after / before * 100:.1f} % of before)",
    ]
    for part, n in sorted(breakdown(slices).items(), key=lambda kv: -kv[1]):
        lines.append(f"  {part:48s} {n / 1e3:7.1f} kB {n / total * 100:5.1f} %")
    per_attr = sorted(repeated_attributes(slices).items(), key=lambda kv: -kv[1])
    lines.append("  MIG devices' attributes by name: " + ", ".join(
        f"{k} {n / 1e3:.1f} kB" for k, n in per_attr
    ))  # fmt: skip
    shown = ", ".join(f"{p} x{n}" for p, n in sorted(placements(slices).items()))
    lines.append(f"  placements per GPU: {shown}")
    return "\n".join(lines)
