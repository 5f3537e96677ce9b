"""MIG figures that cannot be gamed: at the same offered load, how much
work each device order serves and how often it refuses a request that one
GPU had room for.

Setting: an 8 x H200 node as our discovery publishes it (NVML fake), split
into slices by our slice builder. A faithful model of the scheduler's first
fit (``FirstFit``) replays one random stream of MIG requests and releases:
like the allocator that 1.37 runs with its default gates (``structured/
internal/incubating``, 1.36+: ``buildPool`` sorts a pool's slices by name)
it walks the pool's slices in name order, the devices of a slice in order,
and takes the first device of the asked profile whose counters all stay
non-negative. ``--allocator stable`` walks the slices in a random order each
time instead, as the stable allocator does (the informer lists them
unordered). The model is validated against the real scheduler in
``tests/e2e/test_mig_e2e.py``. Every order sees the same stream; reported
per order: the share of requests served, the compute slices served, and
fragmentation refusals (a request refused although one GPU had the free
memory slots and compute for it). Orders: name order, ours (static,
``driver.mig.order.preference_order``) and two state-aware ones
(``tests/bench/mig_state.py``: the pool re-published after every MIG
prepare and unprepare, ranked for the occupancy then), with the pool
rewrites and slice writes that re-publishing costs. Per release p it also
prints ours against name order per block of ``--block`` runs (median and
range), and with ``--bounds`` what no published order reaches
(``tests/bench/mig_bounds.py``: the best static order a search finds, a
clairvoyant chooser). Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.checkpoint import Checkpoint
from driver.devices.kind import Discovery
from driver.devices.model import Device
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices.build import PoolSpec, build_slices
from tests.bench import mig_bounds
from tests.bench.mig_state import StateOrder

Attrs = Mapping[str, Any]
# A request stream's mix (H200 profile names).
MIX = {"1g.18gb": 35, "1g.35gb": 10, "2g.35gb": 25, "3g.71gb": 20, "4g.71gb": 5, "7g.141gb": 5}


def attr(device: Mapping[str, Any], name: str) -> Any:
    value = device.get("attributes", {}).get(name)
    return None if value is None else next(iter(value.values()))


class FirstFit:
    """The allocator's first fit over published slice specs (camelCase JSON)."""

    def __init__(self, specs: Sequence[Mapping[str, Any]], rng: random.Random | None = None):
        self.left: dict[str, dict[str, int]] = {}
        self.slices: list[list[Mapping[str, Any]]] = []
        for spec in specs:
            for cs in spec.get("sharedCounters") or []:
                self.left[cs["name"]] = {k: int(v["value"]) for k, v in cs["counters"].items()}
            if spec.get("devices"):
                self.slices.append(list(spec["devices"]))
        self.taken: set[str] = set()
        self._rng = rng

    def _fits(self, device: Mapping[str, Any], sign: int = 1) -> bool:
        for use in device.get("consumesCounters") or []:
            have = self.left[use["counterSet"]]
            if any(have[k] - int(v["value"]) < 0 for k, v in use["counters"].items()):
                return False
        return True

    def _apply(self, device: Mapping[str, Any], sign: int) -> None:
        for use in device.get("consumesCounters") or []:
            for k, v in use["counters"].items():
                self.left[use["counterSet"]][k] -= sign * int(v["value"])

    def allocate(self, wants: Callable[[Mapping[str, Any]], bool]) -> Mapping[str, Any] | None:
        order = list(self.slices)
        if self._rng is not None:
            self._rng.shuffle(order)
        for devices in order:
            for device in devices:
                if device["name"] not in self.taken and wants(device) and self._fits(device):
                    self.taken.add(device["name"])
                    self._apply(device, 1)
                    return device
        return None

    def release(self, device: Mapping[str, Any]) -> None:
        self.taken.discard(device["name"])
        self._apply(device, -1)

    def reorder_by(self, rank: Mapping[str, int]) -> None:
        """The pool re-published with each slice's devices in ``rank`` order
        (devices not ranked keep their place in front)."""
        for devices in self.slices:
            devices.sort(key=lambda d: rank.get(d["name"], -1))


def profile_is(name: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda d: attr(d, "type") == "mig" and attr(d, "profile") == name


def discovery(gpus: int = 8, model: str = "H200-SXM5-141GB") -> Discovery:
    machine = FakeMachine()
    for i in range(gpus):
        machine.add_gpu(f"GPU-{i:04d}", model, f"0000:{0x10 + i:02x}:00.0")
    backend = FakeNvml(machine)
    support = MigSupport(
        NvmlSession(backend),
        MigPolicy.parse("all", "", True, False),
        lambda s, g: MigHandler(s, g, Path("/nonexistent")),
        Checkpoint,
    )
    return GpuType(backend, Path("/nonexistent"), Path("/nonexistent"), mig=support).discover()


def stream(seed: int, steps: int, release_p: float) -> list[tuple[str, float]]:
    rng = random.Random(seed)
    names, weights = list(MIX), list(MIX.values())
    return [
        ("release", rng.random()) if rng.random() < release_p
        else (rng.choices(names, weights)[0], 0.0)
        for _ in range(steps)
    ]  # fmt: skip


class Served:
    """What one order did with one stream."""

    def __init__(self) -> None:
        self.requests = self.served = self.compute = self.fragmentation = 0
        self.rewrites = self.slice_writes = self.mig_ops = 0

    def add(self, other: Served) -> None:
        for k, v in vars(other).items():
            setattr(self, k, getattr(self, k) + v)


def had_room(model: FirstFit, slots: int, compute: int) -> bool:
    """Whether one GPU had ``slots`` free memory slots and ``compute`` left."""
    return any(
        sum(v for k, v in left.items() if k.startswith("mem")) >= slots
        and left.get("compute", 0) >= compute
        for left in model.left.values()
    )


def serve(
    found: Discovery, order: str, ops: list[tuple[str, float]], seed: int, shuffle: bool = False
) -> Served:
    """Replay ``ops`` on the pool published in ``order``: ``name``, ``static``
    (ours) or ``state:<ranking>`` (re-published after each MIG op)."""
    devices = (
        tuple(sorted(found.devices, key=lambda d: d.name)) if order == "name" else found.devices
    )
    sizes = {str(d.attributes["profile"]): (_int(d, "memorySlots"), _int(d, "computeSlices"))
             for d in found.devices if d.kind == "mig"}  # fmt: skip
    published = layout(found, devices)
    model = FirstFit(published, random.Random(seed) if shuffle else None)
    ranking = StateOrder(devices, order.split(":", 1)[1]) if order.startswith("state") else None
    out, held = Served(), list[Mapping[str, Any]]()
    current: dict[str, int] = {}

    def republish() -> None:  # after a MIG prepare or unprepare
        nonlocal current
        out.mig_ops += 1
        if ranking is None:
            return
        fresh = ranking.rank(model.left)
        if fresh != current:
            if current:  # the first ranking is the initial publish
                out.rewrites += 1
                out.slice_writes += len(published)
            current = fresh
            model.reorder_by(fresh)

    republish()
    out.mig_ops = 0
    for op, u in ops:
        if op == "release":
            if held:
                model.release(held.pop(int(u * len(held))))
                republish()
            continue
        out.requests += 1
        device = model.allocate(profile_is(op))
        if device is None:
            out.fragmentation += had_room(model, *sizes[op])
            continue
        held.append(device)
        out.served += 1
        out.compute += sizes[op][1]
        republish()
    return out


def _int(device: Device, name: str) -> int:
    value = device.attributes.get(name, 0)
    return value if isinstance(value, int) else 0


def layout(found: Discovery, devices: tuple[Device, ...]) -> list[dict[str, Any]]:
    pool = PoolSpec("patchbay.dev", "n", "n-patchbay", {"nodeName": "n"}, devices,
                    found.counter_sets)  # fmt: skip
    return [s.spec for s in sorted(build_slices(pool), key=lambda s: s.name)]


ORDERS = {
    "name": "name order",
    "static": "patchbay order",
    "state:damage": "state: damage",
    "state:damage-all": "state: damage-all",
    "state:best-fit": "state: best-fit",
}


def main(argv: Sequence[str] = ()) -> dict[str, Served]:
    parser = argparse.ArgumentParser(prog="mig_bench")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--release-p", type=float, nargs="+", default=[0.4, 0.45])
    parser.add_argument(
        "--allocator",
        choices=("incubating", "stable"),
        default="incubating",
        help="incubating (1.36+ default): slices in name order; stable: shuffled",
    )
    parser.add_argument("--block", type=int, default=10, help="runs per block for the median")
    parser.add_argument("--bounds", action="store_true", help="also print mig_bounds' figures")
    parser.add_argument("--search-steps", type=int, default=2500)
    args, _ = parser.parse_known_args(list(argv))
    shuffle = args.allocator == "stable"
    found = discovery()
    results: dict[str, Served] = {}
    for release_p in args.release_p:
        totals = {k: Served() for k in ORDERS}
        blocks: list[tuple[int, int]] = []
        for run in range(args.runs):
            ops = stream(run, args.steps, release_p)
            if run % args.block == 0:
                blocks.append((0, 0))
            for key in ORDERS:
                done = serve(found, key, ops, run, shuffle)
                totals[key].add(done)
                if key in ("name", "static"):
                    n, o = blocks[-1]
                    blocks[-1] = (n + done.fragmentation * (key == "name"),
                                  o + done.fragmentation * (key == "static"))  # fmt: skip
        print(f"MIG, 8 x H200, {args.allocator} allocator, {args.runs} runs x {args.steps} steps"
              f" (release p={release_p}), the same requests for every order:")  # fmt: skip
        print(f"  {'order':18s} {'served':>7s} {'compute slices':>15s} {'fragmentation':>14s}"
              f" {'pool rewrites':>14s} {'slice writes':>13s}")  # fmt: skip
        for key, label in ORDERS.items():
            t = totals[key]
            per_op = t.rewrites / t.mig_ops if t.mig_ops else 0.0
            n, served = args.runs, 100 * t.served / t.requests
            print(f"  {label:18s} {served:6.1f}% {t.compute / n:15.1f} {t.fragmentation / n:14.2f}"
                  f" {per_op:9.2f}/op {t.slice_writes / n:13.1f}")  # fmt: skip
        name, ours = totals["name"].fragmentation, totals["static"].fragmentation
        print(f"  fragmentation refusals: ours {pct(ours, name)} vs name order;" + "".join(
            f" {ORDERS[k]} {pct(totals[k].fragmentation, ours)} vs ours,"
            for k in ORDERS if k.startswith("state")))  # fmt: skip
        ratios = sorted(o / n for n, o in blocks if n)
        if ratios:
            print(f"  ours / name order per block of {args.block} runs: median"
                  f" {100 * statistics.median(ratios):.0f} %, range {100 * ratios[0]:.0f}-"
                  f"{100 * ratios[-1]:.0f} % ({len(ratios)} blocks)")  # fmt: skip
        results.update({f"{key}@{release_p}": totals[key] for key in ORDERS})
    if args.bounds and not shuffle:
        bounds(found, args)
    return results


def bounds(found: Discovery, args: argparse.Namespace) -> None:
    """Name order, ours, the searched static order and the clairvoyant
    chooser on the bench's streams and on held-out ones (mig_bounds)."""
    gpus = len(found.counter_sets)
    name = mig_bounds.candidates(layout(found, tuple(sorted(found.devices, key=lambda d: d.name))))
    ours = mig_bounds.candidates(layout(found, found.devices))[1]
    train = [stream(1000 + r, args.steps, p) for p in args.release_p for r in range(40)]
    searched = mig_bounds.search(ours, gpus, train, args.search_steps)
    left_out = len(searched) - 1 - searched.index(None)
    print(f"Bounds, 8 x H200: a static order searched on 40 other streams per release p"
          f" ({args.search_steps} steps, {left_out} placements left out), and a chooser"
          f" that knows the rest of the stream; refusals per run (% of name order),"
          f" compute slices per run:")  # fmt: skip
    for label, first in (("bench streams", 0), ("held-out streams", 2000)):
        for p in args.release_p:
            streams = [stream(first + r, args.steps, p) for r in range(args.runs)]
            rows = {
                "name order": mig_bounds.cost(name[1], gpus, streams),
                "patchbay order": mig_bounds.cost(ours, gpus, streams),
                "searched static": mig_bounds.cost(searched, gpus, streams),
            }
            seer = [mig_bounds.replay(mig_bounds.Compact(gpus, ours), ops, [],
                                      mig_bounds.clairvoyant) for ops in streams]  # fmt: skip
            rows["clairvoyant"] = (sum(r for r, _ in seer), sum(s for _, s in seer))
            base = rows["name order"][0] or 1
            print(f"  {label} (release p={p}): " + "; ".join(
                f"{k} {r / args.runs:.2f} ({100 * r / base:.0f} %), {s / args.runs:.1f}"
                for k, (r, s) in rows.items()))  # fmt: skip


def pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f} %" if b else "n/a"


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
