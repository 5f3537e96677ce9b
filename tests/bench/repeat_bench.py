"""A test module run many times in a row, to find what fails once in N (issue 33).

``make bench BENCH=repeat`` runs ``tests/e2e/test_fabric_e2e.py`` (both
fabric dialects: its tests are parametrized by ``FABRIC_DIALECTS``) 10 times,
each in a pytest process of its own with a fresh control plane, one after
another, and prints each run's outcome and wall time, then the totals per
dialect. ``--runs`` and ``--target`` choose another count or module. A flaky
test is a bug report: the first failure's output is kept in full under
``--keep`` (a temporary directory by default) and its path printed.

It asserts nothing and is not part of ``make test``; its exit code is 0
whatever the runs gave, so a bench run always prints its figures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

DEFAULT_TARGET = "tests/e2e/test_fabric_e2e.py"
PARAM = re.compile(r"\[([^\]]+)\]$")  # a test id's parameter, the dialect here


def outcomes(junit: Path) -> Counter[tuple[str, str]]:
    """(parameter, outcome) counts of one run's JUnit report."""
    counts: Counter[tuple[str, str]] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        match = PARAM.search(case.get("name", ""))
        param = match.group(1) if match else "-"
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        counts[param, outcome] += 1
    return counts


def run_once(target: str, report: Path, log: Path) -> tuple[int, float]:
    """One pytest process over `target`; its exit code and wall seconds."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cluster",
             f"--junitxml={report}", target],
            stdout=out, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    return proc.returncode, time.monotonic() - started


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--keep", type=Path, default=None, help="where each run's log stays")
    args = parser.parse_args(argv)
    keep = args.keep or Path(tempfile.mkdtemp(prefix="patchbay-repeat-"))
    keep.mkdir(parents=True, exist_ok=True)
    totals: Counter[tuple[str, str]] = Counter()
    walls: list[float] = []
    failed: list[int] = []
    for i in range(1, args.runs + 1):
        report, log = keep / f"run-{i}.xml", keep / f"run-{i}.log"
        rc, wall = run_once(args.target, report, log)
        walls.append(wall)
        counts = outcomes(report) if report.exists() else Counter({("-", "error"): 1})
        totals.update(counts)
        bad = sum(n for (_, outcome), n in counts.items() if outcome in ("failure", "error"))
        if rc != 0 or bad:
            failed.append(i)
        verdict = "green" if rc == 0 and not bad else f"RED (exit {rc}, {bad} failed): {log}"
        print(f"run {i:2d}/{args.runs}: {wall:6.0f} s  {verdict}", flush=True)
    if failed:
        print(f"\n{args.target}: {len(failed)} of {args.runs} runs red: {failed}")
    else:
        print(f"\n{args.target}: {args.runs} runs, all green, one after another")
    for param in sorted({p for p, _ in totals}):
        kinds = ("passed", "failure", "error", "skipped")
        row = [f"{o} {totals[param, o]}" for o in kinds if totals[param, o]]
        print(f"  [{param}] " + ", ".join(row))
    median, worst = statistics.median(walls), max(walls)
    print(f"  run wall: median {median:.0f} s, max {worst:.0f} s; logs: {keep}")


if __name__ == "__main__":
    main(sys.argv[1:])
