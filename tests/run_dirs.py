"""The test tiers' run directories: gone after a session in which every test
passed, kept and named after one that failed.

Why this module exists: each tier works in a directory of its own under
/tmp (etcd's data, simulated hosts, containerd's state and images, every
component's log): 80-150 MB per cluster-tier worker, about 380 MB per gated
control plane and 700 MB for the real nodes, about 1.8 GB after one
``make test``. They used to stay until the next run removed them, for their
logs. A run leaves the machine as it found it, so a session whose tests all
passed now removes the directories its tiers are done with, and a session
with a failure keeps them (their logs are what a reader needs) and says
where; the next session removes a kept one before it starts, as the tiers'
fixtures always did. ``PATCHBAY_KEEP_RUN_DIRS=1`` keeps them whatever the
outcome.

A tier hands its directory over with :func:`done_with` only after its
teardown stopped everything that ran there, and a directory with a mount
point below it is never removed (a teardown that did not finish): removing
through a mount would remove what it mounts.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

KEEP_ENV = "PATCHBAY_KEEP_RUN_DIRS"

_OCTAL = re.compile(r"\\([0-7]{3})")  # mountinfo's escapes: \040 for a space
_done: list[Path] = []
_passed: list[bool] = []  # the session's outcome, once it is known


def done_with(path: Path) -> None:
    """``path``'s tier stopped all it ran there: remove it at the end of the
    session if every test passed."""
    if path not in _done:
        _done.append(path)


def mounts_below(path: Path) -> list[str]:
    """Mount points at or below ``path`` (``/proc/self/mountinfo``)."""
    top = str(path.resolve())
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
            if point == top or point.startswith(top + "/"):
                out.append(point)
    return out


def leave(paths: list[Path], passed: bool, keep: bool) -> list[str]:
    """Remove ``paths`` when ``passed`` and not ``keep``; a line for each one kept."""
    lines = []
    for path in paths:
        if not path.exists():
            continue
        if keep or not passed:
            why = KEEP_ENV if keep else "a test failed"
            lines.append(f"kept the run directory {path} ({why}): its logs are there")
        elif mounted := mounts_below(path):
            lines.append(f"kept the run directory {path}: mounted below it: {', '.join(mounted)}")
        else:
            shutil.rmtree(path, ignore_errors=True)
    return lines


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ok = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    _passed.append(ok and session.testsfailed == 0)


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the terminal summary (which may still read a run directory)."""
    passed = bool(_passed) and all(_passed)
    for line in leave(_done, passed, os.environ.get(KEEP_ENV) == "1"):
        sys.stderr.write(line + "\n")
    _done.clear()
