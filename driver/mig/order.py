"""The order MIG devices are published in: the scheduler's first-fit preference.

The allocator that 1.37 runs with its default gates (1.36+,
``k8s.io/dynamic-resource-allocation/structured/internal/incubating``:
``buildPool`` sorts a pool's slices by name, pools by ID) walks our pool's
devices in slice-name order, then in order inside each slice, and takes the
first that fits; our slice names sort in build order
(``driver.slices.build.slice_name``), so the order below is the scheduler's
order across the whole pool. A request names one profile, so what matters is
the order of each profile's (GPU, placement) candidates. Static per publish
(no re-publish per prepare: that costs a pool rewrite per MIG operation,
and the state-aware rankings tried in ``tests/bench/mig_state.py`` did no
better). The rule, by the profile's shape:

Every profile fills the GPUs from the bottom, so the first fit is the
lowest, i.e. fullest, GPU that fits (a best fit by GPU), and the top GPUs
stay empty for 7g and whole-GPU claims. Within that:

- Balanced profiles (as many memory slots as compute slices: 1g, 2g, 4g)
  go GPU by GPU; within a GPU the left half's placements (memory slots 0-3)
  come first, highest start first, then the right half's (1g: 3, 2, 1, 0,
  6, 5, 4; 2g: 2, 0, 4), so the right half stays free longest for the
  placements that use slot 7 (3g at 4, 1g.2x at 6), which no balanced
  placement can use.
- Memory-heavy profiles (more memory slots than compute slices: 1g.2x,
  3g, 7g) take their highest start on every GPU, bottom first, before the
  next start (3g: 4 on GPU 0, 1, ..., then 0): they are the ones that can
  use slot 7, and a 3g at 4 leaves slot 0 for a 4g or a second 3g.
- Full GPUs (plain ones first, then partitionable ones) from the top down,
  so whole-GPU claims and partitions grow from opposite ends. They are
  published before every placement (``driver.slices.order``: a whole-GPU
  request evaluates its class on each device before its first fit).

Measured with ``tests/bench/mig_bench.py`` (the honest refusal metric, one
stream for every order): 26 % / 36 % fewer fragmentation refusals than name
order (itself GPU-major, low start first) and the same compute served
(11 % / 30 % on 40 streams the rule was not chosen on). Orders that spread
partitions over more GPUs refuse less by the metric but serve less (7g finds
no empty GPU); docs/figures.md has the rows. The rule came from a search
over per-profile orders (GPU direction, GPU- or placement-major, start
order), then over whole-pool variants, keeping the compute served.

For the stable allocator (slices in no fixed order: an informer's list),
devices are also emitted in profile groups arranged so that the slice
builder's 64-device cuts fall between groups where possible
(``driver.slices.order.arrange_groups``): a profile's candidates then sit
in one slice and keep their order.
"""

from __future__ import annotations

from collections.abc import Sequence

from driver.devices.model import Device
from driver.mig.layout import MEMORY_SLOTS, placement_of
from driver.slices.limits import MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
from driver.slices.order import arrange_groups


def _int(device: Device, name: str) -> int:
    value = device.attributes.get(name, 0)
    return value if isinstance(value, int) else 0


def placement_key(device: Device) -> tuple[int, ...]:
    """Balanced profiles: GPU by GPU from the bottom, left half first, high
    start first; memory-heavy ones: high start first, bottom GPU first."""
    gpu, start = placement_of(device)
    if _int(device, "memorySlots") > _int(device, "computeSlices"):
        return (-start, gpu)
    return (gpu, int(start >= MEMORY_SLOTS // 2), -start)


def preference_order(full_gpus: Sequence[Device], migs: Sequence[Device]) -> list[Device]:
    """Full GPUs first (plain ones, then partitionable ones high index first),
    then the MIG devices grouped by profile, arranged for the slice cuts."""
    plain = [d for d in full_gpus if not d.has_counters()]
    shared = sorted((d for d in full_gpus if d.has_counters()), key=lambda d: -_int(d, "index"))
    by_profile: dict[str, list[Device]] = {}
    for device in migs:
        by_profile.setdefault(str(device.attributes.get("profile")), []).append(device)
    groups = [sorted(g, key=placement_key) for g in by_profile.values()]
    head = plain + shared
    return head + arrange_groups(groups, MAX_DEVICES_WITH_COUNTERS_OR_TAINTS, len(head))
