"""The order of a node's own pool across its device kinds (issue 34, step 3).

Why: the allocator (1.37, ``structured/internal/incubating``) walks a pool's
devices in slice-name order, then in order inside each slice, and evaluates
the request's class and selectors (CEL) on each until one fits. Every class
we ship selects one device type, so a request pays one CEL evaluation per
device of another type that sits before its own, for every node tried (230
of 500). With the MIG placements first, a whole-GPU request walked the 64
placements of the first slice before the first full GPU on every node: 46 %
of the scheduler's CPU for whole-GPU pods (docs/scale.md, "Where the
scheduler's time goes").

So the few devices of the kinds most requests ask for whole come first, in
:data:`HEAD_KINDS` order (full GPUs, GPU shares, VFs: 24 devices on a
4-GPU node), and the many MIG placements after them. Each kind keeps its own
order (full GPUs and MIG placements as ``driver.mig.order`` ranks them for
packing, shares and VFs as their families list them), so no request's first
fit changes: no class matches two kinds. docs/scale.md weighs which request
walks which devices. The placements that follow are regrouped by profile
and arranged so that the 64-device slice cuts fall between profiles
(:func:`arrange_groups`), as ``driver.mig.order`` does from the top of a
pool, for an allocator that reads slices in no fixed order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from driver.devices.model import Device
from driver.slices.limits import MAX_DEVICES_WITH_COUNTERS_OR_TAINTS

# Device kinds published at the head of a node's pool, in this order: a
# whole-GPU request walks nothing, a share walks the full GPUs, a VF (alone
# or paired with a GPU on its root) the full GPUs and shares.
HEAD_KINDS = ("gpu", "shared-gpu", "vf")
PLACEMENT_KIND = "mig"  # the many: a device per (profile, placement)


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


def arrange_groups(groups: Sequence[Sequence[Device]], cap: int, start: int = 0) -> list[Device]:
    """Concatenate ``groups`` so that cuts every ``cap`` devices split few of
    them, ``start`` devices already standing before the first."""
    remaining = [list(g) for g in groups if g]
    out: list[Device] = []
    while remaining:
        room = cap - (start + len(out)) % cap
        chosen = _best_subset([len(g) for g in remaining[:12]], room)
        if not chosen:  # nothing fits the room: the largest group is split anyway
            chosen = (max(range(len(remaining)), key=lambda i: len(remaining[i])),)
        for i in chosen:
            out.extend(remaining[i])
        remaining = [g for i, g in enumerate(remaining) if i not in chosen]
    return out


def _profiles(devices: Sequence[Device]) -> list[list[Device]]:
    """Placements by profile, groups in order of first appearance."""
    groups: dict[str, list[Device]] = {}
    for device in devices:
        groups.setdefault(str(device.attributes.get("profile", "")), []).append(device)
    return list(groups.values())


def node_order(devices: Sequence[Device]) -> list[Device]:
    """``devices`` (a node's pool): the :data:`HEAD_KINDS` first, then the MIG
    placements arranged by profile for the slice cuts, then every other kind;
    each kind in its own order."""
    head = [d for kind in HEAD_KINDS for d in devices if d.kind == kind]
    placements = [d for d in devices if d.kind == PLACEMENT_KIND and d.kind not in HEAD_KINDS]
    tail = [d for d in devices if d.kind not in (*HEAD_KINDS, PLACEMENT_KIND)]
    cap = MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
    return head + arrange_groups(_profiles(placements), cap, len(head)) + tail
