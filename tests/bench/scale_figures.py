"""The scale bench's figures: per kind and fabric, the median of its bursts with
the spread, and issue 34's ratios against their targets.

Why a module: one burst is noisy on a shared 2-core machine, so each figure
is the median of several bursts (``--bursts``), taken in rounds that publish
and withdraw the fabric pool between them (``scale_fabric``), so that "with"
and "without" come from the same run, the same nodes and the same
neighbours. What a figure is (scheduler CPU per pod, pods/s, p50 and p99 to
done), how the bursts are summed up and which ratios issue 34 targets live
here, apart from how a burst is run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tests.bench.sched_bench import percentile

WITHOUT = "without"
CPU_RATIO = 1.25  # a non-fabric kind with the fabric pool / without, at most
BASE_RATIO = 3.0  # a kind without the fabric pool / the plain baseline, at most
FABRIC_RATE = 0.5  # fabric pods/s / the plain baseline's, at least (the 5000-node target)


def fabric_label(gpus: int) -> str:
    return f"{gpus} devices" if gpus else WITHOUT


@dataclass(frozen=True)
class Burst:
    """One burst: pods asked for, latencies of those done, span (first creation
    to last done), the scheduler's CPU seconds over it."""

    pods: int
    lat: tuple[float, ...]
    span: float
    cpu_s: float

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s / self.pods * 1000

    @property
    def rate(self) -> float:
        return len(self.lat) / self.span if self.lat and self.span > 0 else 0.0

    @property
    def p50(self) -> float:
        return statistics.median(self.lat) if self.lat else float("nan")

    @property
    def p99(self) -> float:
        return percentile(list(self.lat), 0.99) if self.lat else float("nan")


Reading = Callable[[Burst], float]
# name -> (reading, label, decimals, unit)
READINGS: dict[str, tuple[Reading, str, int, str]] = {
    "CPU": (lambda b: b.cpu_ms, "CPU", 0, " ms/pod"),
    "rate": (lambda b: b.rate, "", 1, " pods/s"),
    "p50": (lambda b: b.p50, "p50", 2, "s"),
    "p99": (lambda b: b.p99, "p99", 2, "s"),
}


class Figures:
    """Bursts by (kind, fabric), in the order first seen."""

    def __init__(self) -> None:
        self.bursts: dict[tuple[str, str], list[Burst]] = {}

    def add(self, kind: str, fabric: str, burst: Burst) -> None:
        self.bursts.setdefault((kind, fabric), []).append(burst)

    def median(self, kind: str, fabric: str, what: str) -> float | None:
        runs = self.bursts.get((kind, fabric))
        if not runs:
            return None
        return statistics.median(READINGS[what][0](b) for b in runs)

    def cell(self, kind: str, fabric: str, what: str) -> str:
        read, label, places, unit = READINGS[what]
        values = [read(b) for b in self.bursts[(kind, fabric)]]
        mid, lo, hi = statistics.median(values), min(values), max(values)
        return f"{label} {mid:.{places}f}{unit} ({lo:.{places}f}-{hi:.{places}f})".lstrip()

    def table(self) -> str:
        """One line per kind and fabric: medians, (min-max) of the bursts."""
        lines = ["  per kind and fabric pool: median of bursts (min-max)"]
        for (kind, fabric), runs in self.bursts.items():
            short = sum(b.pods - len(b.lat) for b in runs)
            tail = f", {short} pods not done" if short else ""
            cells = "  ".join(self.cell(kind, fabric, w) for w in READINGS)
            lines.append(f"    {kind:18s} {fabric:12s} {cells}  [{len(runs)} bursts{tail}]")
        return "\n".join(lines)

    def ratios(self, plain: str, fabric_kind: str) -> str:
        """Issue 34's targets, each a ratio of medians from this run, with a verdict."""
        kinds = list(dict.fromkeys(k for k, _ in self.bursts))
        fabrics = [f for f in dict.fromkeys(f for _, f in self.bursts) if f != WITHOUT]
        lines = ["  ratios (scheduler CPU per pod unless said; target in brackets)"]
        for fab in fabrics:
            row = []
            for kind in kinds:
                if kind == fabric_kind:
                    continue
                row.append(self._ratio(kind, kind, fab, WITHOUT, "CPU", CPU_RATIO, True))
            lines.append(f"    with {fab} / without (<= {CPU_RATIO}x): " + ", ".join(row))
        row = [
            self._ratio(kind, plain, WITHOUT, WITHOUT, "CPU", BASE_RATIO, True)
            for kind in kinds
            if kind not in (plain, fabric_kind)
        ]
        lines.append(f"    without the fabric pool / plain baseline (<= {BASE_RATIO}x): "
                     + ", ".join(row))  # fmt: skip
        for fab in fabrics:
            got = self._ratio(fabric_kind, plain, fab, fab, "rate", FABRIC_RATE, False)
            lines.append(f"    fabric pods/s / plain baseline's, both with {fab} "
                         f"(>= {FABRIC_RATE}x at 5000 nodes): {got}")  # fmt: skip
        return "\n".join(lines)

    def _ratio(
        self, kind: str, base: str, fab: str, base_fab: str, what: str, target: float,
        at_most: bool,
    ) -> str:  # fmt: skip
        top, bottom = self.median(kind, fab, what), self.median(base, base_fab, what)
        if top is None or not bottom:
            return f"{kind} n/a"
        ratio = top / bottom
        met = ratio <= target if at_most else ratio >= target
        return f"{kind} {ratio:.2f}x {'met' if met else 'MISSED'}"
