"""Per-PF VF bandwidth: a PF's line rate shared by its VFs, counted by the scheduler.

Why this module exists: SR-IOV users split a PF's line rate between its VFs,
and the scheduler must refuse a VF share that no longer fits on the PF.
Kubernetes 1.37 offers two tools for it (KEP-5941's shared consumable
capacity is not in 1.37.2): counters (partitionable devices) and consumable
capacity on one device. We use counters; ``docs/sharing.md`` ("VF
bandwidth") says why. For a PF whose selector has ``bandwidthTiers``:

- a counter set ``pf-<pf address>`` holds its line rate as ``bandwidth``,
  and sets ``pf-<pf address>-vfs<k>`` hold one counter ``vf-<i>`` (value 1)
  per VF, 32 to a set (the API's limit per set);
- each VF is published once per tier, ``<vf name>-<tier>`` (``-40g``), with
  capacity ``bandwidth`` = the tier, consuming the tier from the PF's set and
  its own ``vf-<i>`` counter, so two tiers of one VF never go to two claims.

A claim asks ``capacity.requests: {bandwidth: 40G}``; the 1.37 allocator
reads that as "the device's ``bandwidth`` is at least 40G" on a device that
is not shared, and takes the first device that fits: tiers are published in
ascending order, so that is the smallest tier that holds the request. A
claim that asks nothing gets the smallest tier. Rates are bits per second
as quantities (``40G``); inside, whole Mb/s, the unit of ``net/<if>/speed``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from driver.devices.model import CounterConsumption, CounterSet, Device
from driver.devices.quantity import canonical
from driver.vf.config import mbps

log = logging.getLogger(__name__)

BANDWIDTH = "bandwidth"  # a tier's capacity, and the PF set's counter
LINE_RATE = "pfLineRateMbps"  # attribute of each tier: its PF's line rate
VFS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet in resource/v1

_warned: set[tuple[str, int]] = set()


def rate(rate_mbps: int) -> str:
    """Mb/s as the quantity of bits per second the slice carries (``40000`` -> ``40G``)."""
    return canonical(f"{rate_mbps}M")


def tier_suffix(rate_mbps: int) -> str:
    """The device-name suffix of a tier: ``-40g``, ``-2500m``."""
    return f"-{rate_mbps // 1000}g" if rate_mbps % 1000 == 0 else f"-{rate_mbps}m"


def pf_set(pf_bdf: str) -> str:
    """The PF's counter set: ``0000:1a:00.0`` -> ``pf-0000-1a-00-0``."""
    return "pf-" + pf_bdf.lower().replace(":", "-").replace(".", "-")


def vf_set(pf_bdf: str, index: int) -> str:
    return f"{pf_set(pf_bdf)}-vfs{index // VFS_PER_SET}"


def vf_counter(index: int) -> str:
    return f"vf-{index}"


def counter_sets(pf_bdf: str, line_mbps: int, indices: Sequence[int]) -> list[CounterSet]:
    """The PF's line-rate set, then its VF sets (one counter per VF)."""
    chunks: dict[int, list[tuple[str, str]]] = {}
    for index in sorted(indices):
        chunks.setdefault(index // VFS_PER_SET, []).append((vf_counter(index), "1"))
    return [
        CounterSet(pf_set(pf_bdf), ((BANDWIDTH, rate(line_mbps)),)),
        *(CounterSet(f"{pf_set(pf_bdf)}-vfs{k}", tuple(c)) for k, c in sorted(chunks.items())),
    ]


def tiers(
    vf: Device, pf_bdf: str, index: int, rates: Sequence[int], line_mbps: int
) -> list[Device]:
    """The VF once per tier that fits the line rate, in ascending order."""
    out = []
    for tier in sorted(rates):
        if tier > line_mbps:
            if (pf_bdf, tier) not in _warned:
                _warned.add((pf_bdf, tier))
                log.warning(
                    "PF %s: bandwidth tier %s above its line rate %s; not offered",
                    pf_bdf,
                    rate(tier),
                    rate(line_mbps),
                )
            continue
        out.append(
            replace(
                vf,
                name=vf.name + tier_suffix(tier),
                attributes={**vf.attributes, LINE_RATE: line_mbps},
                capacity={**vf.capacity, BANDWIDTH: rate(tier)},
                consumes_counters=(
                    CounterConsumption(pf_set(pf_bdf), ((BANDWIDTH, rate(tier)),)),
                    CounterConsumption(vf_set(pf_bdf, index), ((vf_counter(index), "1"),)),
                ),
            )
        )
    return out


def share_mbps(device: Device) -> int | None:
    """The bandwidth a prepared VF device stands for (Mb/s); None: unmanaged."""
    raw = device.capacity.get(BANDWIDTH)
    return None if raw is None else mbps(raw)


def vf_name(device: Device) -> str:
    """The VF's own name, without its tier suffix (``vf-0000-1a-00-2-40g``
    -> ``vf-0000-1a-00-2``)."""
    share = share_mbps(device)
    suffix = "" if share is None else tier_suffix(share)
    return device.name.removesuffix(suffix) if suffix else device.name
