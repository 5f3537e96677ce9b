"""A state-aware MIG order, tried against our static one (``mig_bench``).

After every MIG prepare and unprepare the pool would be re-published with
each profile's candidates ranked for the current occupancy, so that the
scheduler's first fit takes the best placement for it. Two rankings:

- ``damage``: the placement that leaves its GPU the most room for large
  partitions (memory slots of the 3g/4g/7g placements still possible),
  ties to the fuller GPU;
- ``damage-all``: as ``damage``, counting every placement still possible
  (weighted by its memory slots), not only the large ones;
- ``best-fit``: the fullest GPU it fits on, then ``damage`` on that GPU.

Each keeps the groups of :func:`driver.mig.order.preference_order` in their
slices; only the order inside a group changes. An experiment, not shipped:
see the figures it prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from driver.devices.model import Device
from driver.slices.limits import MAX_DEVICES_WITH_COUNTERS_OR_TAINTS

LARGE_SLOTS = 4


def _int(device: Device, name: str) -> int:
    value = device.attributes.get(name, 0)
    return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class Candidate:
    name: str
    counter_set: str
    mask: int  # memory slots it takes, as bits
    compute: int
    media: int
    slots: int


class StateOrder:
    """Ranks the MIG candidates of a published device list for an occupancy."""

    def __init__(self, devices: Sequence[Device], how: str = "damage") -> None:
        self.devices = list(devices)
        self.how = how
        self.by_name: dict[str, Candidate] = {}
        self.groups: list[list[str]] = []  # runs of one profile, never across a slice cut
        for i, d in enumerate(self.devices):
            if d.kind != "mig":
                continue
            (use,) = d.consumes_counters
            counters = dict(use.counters)
            mask = sum(1 << int(k[3:]) for k in counters if k.startswith("mem"))
            self.by_name[d.name] = Candidate(d.name, use.counter_set, mask,
                                             int(counters["compute"]),
                                             int(counters.get("media", 0)),
                                             _int(d, "memorySlots"))  # fmt: skip
            prev = self.devices[i - 1] if i else None
            cut = i % MAX_DEVICES_WITH_COUNTERS_OR_TAINTS == 0
            same = (prev is not None and prev.kind == "mig" and not cut
                    and prev.attributes.get("profile") == d.attributes.get("profile"))  # fmt: skip
            if same:
                self.groups[-1].append(d.name)
            else:
                self.groups.append([d.name])
        self.large: dict[str, list[Candidate]] = {}
        floor = 1 if how == "damage-all" else LARGE_SLOTS
        for c in self.by_name.values():
            if c.slots >= floor:
                self.large.setdefault(c.counter_set, []).append(c)

    def rank(self, left: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """Device name -> position in the re-published pool."""
        state = {
            s: (sum(v << int(k[3:]) for k, v in c.items() if k.startswith("mem")),
                c.get("compute", 0), c.get("media", 0))
            for s, c in left.items()
        }  # fmt: skip

        def fits(c: Candidate, free: int, compute: int, media: int) -> bool:
            return c.mask & free == c.mask and c.compute <= compute and c.media <= media

        def room(s: str, free: int, compute: int, media: int) -> int:
            return sum(c.slots for c in self.large.get(s, ()) if fits(c, free, compute, media))

        def key(item: tuple[int, str]) -> tuple[int, int, int, int]:
            position, name = item
            c = self.by_name[name]
            free, compute, media = state[c.counter_set]
            if not fits(c, free, compute, media):
                return (1, 0, 0, position)
            damage = room(c.counter_set, free, compute, media) - room(
                c.counter_set, free & ~c.mask, compute - c.compute, media - c.media
            )
            fullness = -bin(free).count("1")  # fewer free slots first
            if self.how == "best-fit":
                return (0, -fullness, damage, position)
            return (0, damage, -fullness, position)

        order: dict[str, int] = {}
        for group in self.groups:
            for name in (n for _, n in sorted(enumerate(group), key=key)):
                order[name] = len(order)
        return order
