"""The order MIG devices are published in: the scheduler's first-fit preference.

The scheduler tries a pool's devices in slice order and takes the first
that fits, and a request names one profile, so what matters is the order of
each profile's (GPU, placement) candidates. Our choice, static per publish:

- GPU-major: lower GPUs fill first, so partitions crowd onto few GPUs and
  the higher ones stay whole. Full GPUs go the other way (highest index
  first), so whole-GPU claims and partitions grow from opposite ends.
- Within a GPU, small profiles (under 4 memory slots) take placements from
  the high end (1g at 6, 5, 4, ...) and large ones from the low end, so a
  few small slices leave ``4g``/``3g`` at slot 0 and ``7g`` on other GPUs free.
- No re-publish when the geometry changes: GPU-major order already prefers
  the GPUs that are partitioned (they are the lowest ones), and rewriting
  the pool on every prepare would cost slice writes and generations.

The scheduler lists a pool's slices in no fixed order (an informer cache),
so the order only holds inside one slice. Devices are therefore emitted in
profile groups arranged so that the slice builder's 64-device cuts fall
between groups where possible: a profile's candidates then sit in one slice
and keep their order (8 x H200: 56+8, 56+8, 32+24+8, 16).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from driver.devices.model import Device
from driver.slices.limits import MAX_DEVICES_WITH_COUNTERS_OR_TAINTS

SMALL_SLOTS = 4


def _int(device: Device, name: str) -> int:
    value = device.attributes.get(name, 0)
    return value if isinstance(value, int) else 0


def placement_key(device: Device) -> tuple[int, int]:
    """GPU first; then high-end first for small profiles, low-end for large."""
    start = _int(device, "placementStart")
    small = _int(device, "memorySlots") < SMALL_SLOTS
    return (_int(device, "parentIndex"), -start if small else start)


def _best_subset(sizes: list[int], room: int) -> tuple[int, ...]:
    """Indices of groups filling ``room`` best (exactly if possible), fewest first."""
    best: tuple[int, ...] = ()
    best_sum = 0
    for count in range(1, len(sizes) + 1):
        for combo in combinations(range(len(sizes)), count):
            total = sum(sizes[i] for i in combo)
            if best_sum < total <= room:
                best, best_sum = combo, total
                if total == room:
                    return best
    return best


def arrange_groups(groups: Sequence[Sequence[Device]], cap: int) -> list[Device]:
    """Concatenate ``groups`` so that cuts every ``cap`` devices split few of them."""
    remaining = [list(g) for g in groups if g]
    out: list[Device] = []
    while remaining:
        room = cap - len(out) % cap
        chosen = _best_subset([len(g) for g in remaining[:12]], room)
        if not chosen:  # nothing fits the room: the largest group is split anyway
            chosen = (max(range(len(remaining)), key=lambda i: len(remaining[i])),)
        for i in chosen:
            out.extend(remaining[i])
        remaining = [g for i, g in enumerate(remaining) if i not in chosen]
    return out


def preference_order(full_gpus: Sequence[Device], migs: Sequence[Device]) -> list[Device]:
    """Full GPUs (plain ones first, then partitionable ones high index first)
    and MIG devices grouped by profile, arranged for the slice cuts."""
    plain = [d for d in full_gpus if not d.has_counters()]
    shared = sorted((d for d in full_gpus if d.has_counters()), key=lambda d: -_int(d, "index"))
    by_profile: dict[str, list[Device]] = {}
    for device in migs:
        by_profile.setdefault(str(device.attributes.get("profile")), []).append(device)
    groups = [plain + shared] + [sorted(g, key=placement_key) for g in by_profile.values()]
    return arrange_groups(groups, MAX_DEVICES_WITH_COUNTERS_OR_TAINTS)
