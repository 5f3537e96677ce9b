"""Prepare and unprepare latency pooled over several plugin bench runs.

Why this module exists: issue 36 judges the prepare p99 over three runs
pooled, not run by run, and a run's p99 of 200 pairs is its second-slowest
pair. ``make bench BENCH=plugin`` with ``PLUGIN_BENCH_SAMPLES=<dir>`` writes
each run's latencies there (``tests.bench.plugin_bench --samples-out``);
``python -m tests.bench.pooled <dir>`` prints every contender's pooled
median and p99 and ours over each of the others.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.bench.contenders import Contender, percentile

FIGURES = ("prepare_ms", "unprepare_ms")


def save(path: Path, contenders: list[Contender]) -> None:
    """One run's latencies, every contender's, as JSON."""
    body = {c.label: {f: getattr(c, f) for f in FIGURES} for c in contenders}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def pool(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Every contender's samples of every run, joined."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for label, figures in run.items():
            mine = out.setdefault(label, {f: [] for f in FIGURES})
            for f in FIGURES:
                mine[f] += figures[f]
    return out


def report(runs: list[dict[str, Any]]) -> str:
    pooled = pool(runs)
    labels = list(pooled)
    sizes = ", ".join(f"{k} {len(v[FIGURES[0]])} pairs" for k, v in pooled.items())
    lines = [f"{len(runs)} runs pooled: {sizes}"]
    for f in FIGURES:
        for name, q in (("median", 0.5), ("p99", 0.99)):
            values = {k: percentile(v[f], q) for k, v in pooled.items()}
            ours = values[labels[0]]
            cells = [f"{k} {v:.2f} ms" for k, v in values.items()]
            others = [(k, v) for k, v in values.items() if k != labels[0] and v]
            ratios = [f"{labels[0]}/{k} {ours / v:.2f}" for k, v in others]
            lines.append(f"{f[:-3]} {name}: {', '.join(cells)}; {', '.join(ratios)}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    files = [p for arg in argv for p in sorted(Path(arg).glob("*.json"))] or [Path(a) for a in argv]
    print(report([json.loads(p.read_text()) for p in files]))


if __name__ == "__main__":
    main(sys.argv[1:])
