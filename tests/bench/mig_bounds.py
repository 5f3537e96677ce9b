"""How far any MIG device order could go: the evidence behind issue 26's
packing target (at most 50 % of name order's fragmentation refusals).

``mig_bench`` measures the orders we publish. This module asks what the
orders we do *not* publish would do, on the same streams and with the same
honest metric, so that a missed target comes with its reason:

- ``search``: the best static order a hill climb finds over each profile's
  (GPU, placement) candidate order and over the placement set offered
  (a candidate can be left out of the pool), trained on streams the bench
  does not use, then replayed on the bench's streams and on held-out ones;
- ``clairvoyant``: a state-aware chooser that knows the rest of the stream
  and takes, among the placements that fit, the one after which first fit
  in our order refuses least: a lower bound no published order reaches.

Both run on ``Compact``, the bench's ``FirstFit`` reduced to bit masks (a
candidate per published MIG device, in the pool's walk order); it replays
every stream exactly as ``FirstFit`` does (``tests/unit/
test_mig_bounds.py`` holds it to that). Figures only: nothing asserts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Op = tuple[str, float]


@dataclass(frozen=True)
class Candidate:
    """One published MIG device: its GPU's counter set and what it takes."""

    profile: str
    gpu: int
    mask: int  # memory slots, as bits
    compute: int
    media: int


def candidates(specs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[Candidate]]:
    """Counter sets and MIG candidates of published slice specs, in walk order."""
    sets = [cs["name"] for spec in specs for cs in spec.get("sharedCounters") or []]
    out = []
    for spec in specs:
        for device in spec.get("devices") or []:
            attrs = device.get("attributes", {})
            if attrs.get("type", {}).get("string") != "mig":
                continue
            (use,) = device["consumesCounters"]
            counters = {k: int(v["value"]) for k, v in use["counters"].items()}
            mask = sum(1 << int(k[3:]) for k in counters if k.startswith("mem"))
            out.append(Candidate(attrs["profile"]["string"], sets.index(use["counterSet"]),
                                 mask, counters["compute"], counters.get("media", 0)))  # fmt: skip
    return sets, out


class Compact:
    """First fit over candidates in a given order, with the bench's metric."""

    def __init__(self, gpus: int, order: Sequence[Candidate],
                 sizes: Mapping[str, tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.free = [0xFF] * gpus
        self.compute = [7] * gpus
        self.media = [1] * gpus
        self.by_profile: dict[str, list[Candidate]] = {}
        for c in order:
            self.by_profile.setdefault(c.profile, []).append(c)
        self.sizes = dict(sizes or {})  # profile -> (memory slots, compute slices)
        for c in order:
            self.sizes.setdefault(c.profile, (bin(c.mask).count("1"), c.compute))

    def fits(self, c: Candidate) -> bool:
        g = c.gpu
        return (self.free[g] & c.mask == c.mask and self.compute[g] >= c.compute
                and self.media[g] >= c.media)  # fmt: skip

    def apply(self, c: Candidate, sign: int) -> None:
        self.free[c.gpu] ^= c.mask
        self.compute[c.gpu] -= sign * c.compute
        self.media[c.gpu] -= sign * c.media

    def first_fit(self, profile: str) -> Candidate | None:
        return next((c for c in self.by_profile.get(profile, ()) if self.fits(c)), None)

    def had_room(self, profile: str) -> bool:
        slots, compute = self.sizes[profile]
        return any(bin(f).count("1") >= slots and k >= compute
                   for f, k in zip(self.free, self.compute, strict=True))  # fmt: skip

    def copy(self) -> Compact:
        twin = Compact.__new__(Compact)
        twin.free, twin.compute, twin.media = list(self.free), list(self.compute), list(self.media)
        twin.by_profile, twin.sizes = self.by_profile, self.sizes
        return twin


Chooser = Callable[[Compact, str, Sequence[Op], list[Candidate]], Candidate | None]


def replay(model: Compact, ops: Sequence[Op], held: list[Candidate],
           choose: Chooser | None = None) -> tuple[int, int]:  # fmt: skip
    """(fragmentation refusals, compute slices served) over ``ops``."""
    refusals = served = 0
    for i, (op, u) in enumerate(ops):
        if op == "release":
            if held:
                model.apply(held.pop(int(u * len(held))), -1)
            continue
        c = model.first_fit(op) if choose is None else choose(model, op, ops[i + 1 :], held)
        if c is None:
            refusals += model.had_room(op)
            continue
        model.apply(c, 1)
        held.append(c)
        served += c.compute
    return refusals, served


def clairvoyant(model: Compact, profile: str, rest: Sequence[Op],
                held: list[Candidate]) -> Candidate | None:  # fmt: skip
    """The fitting placement after which first fit refuses least on ``rest``."""
    best: tuple[tuple[int, int], Candidate] | None = None
    seen = set()
    for c in model.by_profile.get(profile, ()):
        state = (model.free[c.gpu], model.compute[c.gpu], model.media[c.gpu], c.mask)
        if state in seen or not model.fits(c):
            continue
        seen.add(state)
        trial = model.copy()
        trial.apply(c, 1)
        refusals, served = replay(trial, rest, [*held, c])
        if best is None or (refusals, -served) < best[0]:
            best = ((refusals, -served), c)
    return None if best is None else best[1]


def cost(order: Sequence[Candidate | None], gpus: int,
         streams: Sequence[Sequence[Op]]) -> tuple[int, int]:  # fmt: skip
    """Refusals and compute served over ``streams``; candidates after a
    ``None`` are left out of the pool."""
    cut = list(order).index(None) if None in order else len(order)
    offered = [c for c in order[:cut] if c is not None]
    sizes = Compact(gpus, [c for c in order if c is not None]).sizes
    totals = [replay(Compact(gpus, offered, sizes), ops, []) for ops in streams]
    return sum(t[0] for t in totals), sum(t[1] for t in totals)


def search(start: Sequence[Candidate], gpus: int, streams: Sequence[Sequence[Op]],
           steps: int, seed: int = 0) -> list[Candidate | None]:  # fmt: skip
    """Hill climb from ``start``: move one candidate (or leave it out) within
    its profile, keep the move when refusals do not rise and the compute
    served does not fall by more than 0.2 %."""
    rng = random.Random(seed)
    order: list[Candidate | None] = [*start, None]
    refused, served = cost(order, gpus, streams)
    floor = served * 0.998
    for _ in range(steps):
        trial = list(order)
        i = rng.randrange(len(trial))
        moved = trial.pop(i)
        if moved is None:
            continue
        same = [j for j, c in enumerate(trial) if c is None or c.profile == moved.profile]
        trial.insert(rng.choice(same) + rng.randrange(2), moved)
        r, s = cost(trial, gpus, streams)
        if r <= refused and s >= floor:
            order, refused = trial, r
    return order
