"""One mode per GPU said with device compatibility groups (KEP-5963).

Why this module exists: a GPU serves one mode at a time (whole, MIG
placements, or fractional shares; docs/sharing.md, "One mode per GPU").
By default the counters say it through an allocator detail: the shared
device consumes its GPU's whole counter set, and the 1.37 allocator charges
an allow-multiple device's counters only for its first share. With
``--compatibility-groups`` (alpha gate ``DRADeviceCompatibilityGroups`` on
the apiserver and scheduler) the pool says it directly instead, on each
consumption of a GPU's counter set:

- every MIG placement (any other device drawing on a full GPU's set) declares
  the group ``mig`` (placements mix with each other; their memory-slot and
  compute counters still keep them apart);
- the shared device declares ``shared`` and consumes nothing of the set (a
  zero of its first counter: the group needs a consumption to live on), so
  the refusal to mix rests on the groups alone, not on the whole-counter trick;
- the full GPU declares no group: a device without groups is co-allocated
  only with others without groups, so never with a placement or a share.

The scheduler ignores a slice that declares groups while the gate is off
(its whole pool is then incomplete), hence off by default. A pure function
of one scan's :class:`Discovery`; applied after the shared devices are added.
"""

from __future__ import annotations

from dataclasses import replace

from driver.devices.kind import Discovery
from driver.devices.model import CounterConsumption, CounterSet, Device
from driver.gpu.fraction import KIND as SHARED

MIG_GROUP = "mig"
SHARED_GROUP = "shared"


def _grouped(consumption: CounterConsumption, group: str) -> CounterConsumption:
    return replace(consumption, compatibility_groups=(group,))


def _nothing_of(consumption: CounterConsumption, sets: dict[str, CounterSet]) -> CounterConsumption:
    """``consumption`` reduced to a zero of its set's first counter, in group ``shared``."""
    first = sets[consumption.counter_set].counters[0][0]
    return CounterConsumption(consumption.counter_set, ((first, "0"),), (SHARED_GROUP,))


def _device(device: Device, sets: dict[str, CounterSet], gpu_sets: set[str]) -> Device:
    if device.kind == SHARED:
        groups = tuple(_nothing_of(c, sets) for c in device.consumes_counters)
    elif device.kind != "gpu" and any(c.counter_set in gpu_sets for c in device.consumes_counters):
        groups = tuple(_grouped(c, MIG_GROUP) for c in device.consumes_counters)
    else:
        return device
    return replace(device, consumes_counters=groups)


def with_compatibility_groups(found: Discovery) -> Discovery:
    """``found`` with MIG placements in group ``mig`` and shared devices in
    group ``shared`` (consuming nothing of their GPU's set); the rest as is."""
    sets = {s.name: s for s in found.counter_sets}
    gpu_sets = {
        c.counter_set
        for d in found.devices
        if d.kind in ("gpu", SHARED)
        for c in d.consumes_counters
    }
    return replace(found, devices=tuple(_device(d, sets, gpu_sets) for d in found.devices))
