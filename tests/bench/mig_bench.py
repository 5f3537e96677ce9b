"""MIG packing: how many large partitions still fit after random churn,
patchbay's device order versus plain name order.

Setting: an 8 x H200 node as our discovery publishes it (NVML fake), split
into slices by our slice builder. A faithful model of the scheduler's
first fit (``FirstFit``) replays one random stream of MIG requests and
releases: like the allocator it walks the pool's slices in a random order
each time (the scheduler's informer lists them unordered), the devices of a
slice in order, and takes the first device of the asked profile whose
counters all stay non-negative. The model is validated against the real
scheduler in ``tests/e2e/test_mig_e2e.py``. After the churn we count how many
3g, 4g and 7g requests (each on its own, from the same state) still fit.
Figures only: nothing here asserts.
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
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices.build import PoolSpec, build_slices

Attrs = Mapping[str, Any]
# A request stream's mix (H200 profile names) and the large profiles measured.
MIX = {"1g.18gb": 35, "1g.35gb": 10, "2g.35gb": 25, "3g.71gb": 20, "4g.71gb": 5, "7g.141gb": 5}
LARGE = ("3g.71gb", "4g.71gb", "7g.141gb")


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


def specs(found: Discovery, by_name: bool) -> list[dict[str, Any]]:
    devices = tuple(sorted(found.devices, key=lambda d: d.name)) if by_name else found.devices
    pool = PoolSpec("patchbay.dev", "n", "n-patchbay", {"nodeName": "n"}, devices,
                    found.counter_sets)  # fmt: skip
    return [s.spec for s in build_slices(pool)]


def stream(seed: int, steps: int, release_p: float) -> list[tuple[str, float]]:
    rng = random.Random(seed)
    names, weights = list(MIX), list(MIX.values())
    return [
        ("release", rng.random()) if rng.random() < release_p
        else (rng.choices(names, weights)[0], 0.0)
        for _ in range(steps)
    ]  # fmt: skip


def replay(slice_specs: list[dict[str, Any]], ops: list[tuple[str, float]], seed: int) -> FirstFit:
    model = FirstFit(slice_specs, random.Random(seed))
    held: list[Mapping[str, Any]] = []
    for op, u in ops:
        if op == "release":
            if held:
                model.release(held.pop(int(u * len(held))))
        elif (device := model.allocate(profile_is(op))) is not None:
            held.append(device)
    return model


def still_fit(model: FirstFit, profile: str) -> int:
    count, taken = 0, []
    while (device := model.allocate(profile_is(profile))) is not None:
        count += 1
        taken.append(device)
    for device in taken:
        model.release(device)
    return count


def main(argv: Sequence[str] = ()) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="mig_bench")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--release-p", type=float, default=0.4)
    args, _ = parser.parse_known_args(list(argv))
    found = discovery()
    layouts = {"patchbay order": specs(found, False), "name order": specs(found, True)}
    figures: dict[str, dict[str, float]] = {k: {p: 0.0 for p in LARGE} for k in layouts}
    for run in range(args.runs):
        ops = stream(run, args.steps, args.release_p)
        for label, layout in layouts.items():
            model = replay(layout, ops, run)
            for profile in LARGE:
                figures[label][profile] += still_fit(model, profile) / args.runs
    print(f"MIG packing, 8 x H200, {args.runs} runs x {args.steps} steps "
          f"(release p={args.release_p}): large requests that still fit, mean per run")  # fmt: skip
    ours, plain = figures["patchbay order"], figures["name order"]
    for profile in LARGE:
        gain = (ours[profile] / plain[profile] - 1) * 100 if plain[profile] else float("inf")
        print(f"  {profile:9s} patchbay {ours[profile]:5.2f}  name order {plain[profile]:5.2f}"
              f"  ({gain:+.0f} %)")  # fmt: skip
    total_ours, total_plain = statistics.fmean(ours.values()), statistics.fmean(plain.values())
    print(f"  all large: {(total_ours / total_plain - 1) * 100:+.0f} %")
    return figures


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
