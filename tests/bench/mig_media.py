"""Which ``+me`` placements to offer: the evidence behind issue 26's cut.

Why: a media-extended profile (``1g.18gb+me`` on H200) used to be offered at
all seven starts of its GPU, 7 of a GPU's 26 devices, although the GPU has
one set of media engines (the ``media`` counter lets one instance hold it).
The lean slices offer it at its lowest start only
(``driver.mig.layout.offered_starts``). This replays the MIG bench's streams
(``mig_bench``: 8 x H200, our order, the honest refusal metric) with ``+me``
requests added to the mix, offering the ``+me`` placements at every start,
at each single start and at a few pairs, and prints per set the share of
requests served, the compute slices served and the fragmentation refusals
per run. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from driver.devices.kind import Discovery
from driver.mig.layout import placement_of
from tests.bench import mig_bench
from tests.bench.mig_shape_v1 import old_shape

MEDIA = "1g.18gb+me"
SETS: dict[str, frozenset[int]] = {
    "every start": frozenset(range(7)),
    **{f"start {s}": frozenset({s}) for s in range(7)},
    "starts 0, 6": frozenset({0, 6}),
    "starts 0, 4": frozenset({0, 4}),
    "starts 3, 6": frozenset({3, 6}),
}


def offering(found: Discovery, starts: frozenset[int]) -> Discovery:
    """``found`` with the ``+me`` placements at ``starts`` only."""
    kept = tuple(
        d
        for d in found.devices
        if d.attributes.get("profile") != MEDIA or placement_of(d)[1] in starts
    )
    return dataclasses.replace(found, devices=kept)


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="mig_media")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--weight", type=int, default=5, help=f"{MEDIA} in the mix (of ~105)")
    parser.add_argument("--release-p", type=float, nargs="+", default=[0.4, 0.45])
    args, _ = parser.parse_known_args(list(argv))
    mig_bench.MIX[MEDIA] = args.weight
    with old_shape():  # every +me placement, to choose from
        found = mig_bench.discovery()
    for p in args.release_p:
        print(f"+me placements, 8 x H200, our order, {args.runs} runs x {args.steps} steps"
              f" (release p={p}, {MEDIA} weight {args.weight}):")  # fmt: skip
        for label, starts in SETS.items():
            pool, total = offering(found, starts), mig_bench.Served()
            for run in range(args.runs):
                ops = mig_bench.stream(run, args.steps, p)
                total.add(mig_bench.serve(pool, "static", ops, run))
            print(f"  {label:12s} served {100 * total.served / total.requests:5.1f} %,"
                  f" compute slices {total.compute / args.runs:6.1f},"
                  f" fragmentation refusals {total.fragmentation / args.runs:6.2f}")  # fmt: skip


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
