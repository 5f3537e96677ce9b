"""Turn a pool of devices into the ResourceSlice objects to publish.

Pure functions only: the publisher decides whether anything must be written.
Devices keep their order (the scheduler's first-fit preference order), are
split into slices that respect the per-slice limits, and counter sets go to
slices of their own (a slice holds devices or counter sets, not both).
Slice names sort in the order the slices are built (:func:`slice_name`):
the allocator that 1.36+ runs with its default gates walks a pool's slices
in name order, so the device order holds across the whole pool.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.devices.model import CounterSet, Device
from driver.slices import limits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolSpec:
    """Everything needed to publish one pool.

    ``node_selection`` is the slice-level node field, e.g.
    ``{"nodeName": "node-a"}`` or ``{"perDeviceNodeSelection": True}``.
    ``slice_of`` (device name -> bucket), when given, keeps each bucket's
    devices together: slices are cut between buckets (and within one only
    when it breaks the per-slice limit), never across one for fullness.
    """

    driver: str
    pool_name: str
    name_prefix: str
    node_selection: Mapping[str, Any]
    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...] = ()
    owner: Mapping[str, Any] | None = None
    labels: Mapping[str, str] | None = None
    slice_of: Mapping[str, int] | None = None


@dataclass(frozen=True)
class DesiredSlice:
    """One slice's name and spec, without pool generation and slice count."""

    name: str
    spec: dict[str, Any]


def slice_name_prefix(pool_name: str, driver: str) -> str:
    """A DNS-subdomain prefix for a pool's slices, short enough for any pool."""
    base = f"{pool_name}-{driver.split('.')[0]}".lower()
    if len(base) <= 200:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[:189]}-{digest}"


def left_out(devices: Sequence[Device]) -> dict[int, str]:
    """Why each device the apiserver would refuse (or a second one of a name)
    cannot be published, by its index in ``devices``."""
    seen: set[str] = set()
    out: dict[int, str] = {}
    for i, device in enumerate(devices):
        problems = limits.device_problems(device)
        if device.name in seen:
            problems.append("duplicate device name in pool")
        if problems:
            out[i] = "; ".join(problems)
        else:
            seen.add(device.name)
    return out


def publishable(devices: Sequence[Device]) -> list[Device]:
    """Devices that respect the apiserver's limits and have unique names."""
    bad = left_out(devices)
    for i, why in bad.items():
        log.error("device %s left out of the pool: %s", devices[i].name, why)
    return [d for i, d in enumerate(devices) if i not in bad]


def _chunks(devices: Sequence[Device]) -> list[list[Device]]:
    chunks: list[list[Device]] = []
    current: list[Device] = []
    for device in devices:
        candidate = [*current, device]
        cap = (
            limits.MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
            if any(d.has_counters() or d.taints for d in candidate)
            else limits.MAX_DEVICES
        )
        if len(candidate) > cap:
            chunks.append(current)
            current = [device]
        else:
            current = candidate
    if current:
        chunks.append(current)
    return chunks


def _buckets(devices: list[Device], slice_of: Mapping[str, int] | None) -> list[list[Device]]:
    """Devices grouped by bucket (buckets in order of first appearance)."""
    if slice_of is None:
        return [devices]
    groups: dict[int, list[Device]] = {}
    for device in devices:
        groups.setdefault(slice_of.get(device.name, -1), []).append(device)
    return list(groups.values())


def build_slices(pool: PoolSpec) -> list[DesiredSlice]:
    """The slices for ``pool``; at least one, so an empty pool is still known."""
    bodies: list[dict[str, Any]] = []
    sets = list(pool.counter_sets)
    for i in range(0, len(sets), limits.MAX_COUNTER_SETS):
        bodies.append(
            {"sharedCounters": [s.to_json() for s in sets[i : i + limits.MAX_COUNTER_SETS]]}
        )
    for group in _buckets(publishable(pool.devices), pool.slice_of):
        for chunk in _chunks(group):
            bodies.append({"devices": [d.to_json() for d in chunk]})
    if not bodies:
        bodies.append({"devices": []})
    out = []
    for index, extra in enumerate(bodies):
        spec: dict[str, Any] = {"driver": pool.driver, **pool.node_selection, **extra}
        out.append(DesiredSlice(name=slice_name(pool.name_prefix, index, len(bodies)), spec=spec))
    return out


def slice_name(prefix: str, index: int, count: int) -> str:
    """The name of slice ``index`` of ``count``: names sort as the slices are
    built, because the scheduler's allocator (1.36+, ``structured/internal/
    incubating``) walks a pool's slices in name order and takes the first fit.
    The index is zero-padded to the width of the largest (``-0``..``-9`` for
    up to ten slices, ``-00``..``-11`` for twelve)."""
    return f"{prefix}-{index:0{len(str(max(count - 1, 0)))}d}"


def slice_object(
    pool: PoolSpec, desired: DesiredSlice, generation: int, count: int
) -> dict[str, Any]:
    """The full API object for one desired slice at a pool generation."""
    meta: dict[str, Any] = {"name": desired.name}
    if pool.owner:
        meta["ownerReferences"] = [dict(pool.owner)]
    if pool.labels:
        meta["labels"] = dict(pool.labels)
    spec = dict(desired.spec)
    spec["pool"] = {"name": pool.pool_name, "generation": generation, "resourceSliceCount": count}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": spec,
    }
