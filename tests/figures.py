"""Figures a test measured, printed in the run's closing summary.

Why: `pytest -q` shows nothing a passing test prints, and some figures are
the point of a test that asserts on them anyway (the DMTF validators'
pass/warn/fail counts). A test calls :func:`report`; ``tests/conftest.py``
writes every reported line after the run, whatever the verbosity, also those
an xdist worker reported (:func:`keep` takes them in on the controller).
"""

from __future__ import annotations

_LINES: list[str] = []


def report(line: str) -> None:
    """Print ``line`` in the run's closing summary (and now, for -s runs)."""
    _LINES.append(line)
    print(line)


def keep(line: str) -> None:
    """Take in a line another process (an xdist worker) reported."""
    _LINES.append(line)


def lines() -> list[str]:
    return list(_LINES)
