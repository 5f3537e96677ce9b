"""A pytest run stopped with SIGTERM runs its fixtures' teardowns (tests/sigterm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.poll import wait_for

REPO = Path(__file__).resolve().parents[2]

INNER = """
import threading
from pathlib import Path

import pytest

MARKS = Path(__file__).with_name("marks")


@pytest.fixture
def started():
    MARKS.write_text("up\\n")
    yield
    with MARKS.open("a") as out:
        out.write("down\\n")


def test_waits_to_be_stopped(started):
    threading.Event().wait()
"""


def _run_and_stop(tmp_path: Path, *plugin: str) -> tuple[int, str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    marks = tmp_path / "marks"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for("the inner run's fixture set up", lambda: marks.exists(), timeout=120)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=120), marks.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_tears_down_what_the_run_started(tmp_path: Path) -> None:
    rc, marks = _run_and_stop(tmp_path, "-p", "tests.sigterm")
    assert marks == "up\ndown\n"
    assert rc == pytest.ExitCode.INTERRUPTED


def test_without_it_sigterm_skips_the_teardown(tmp_path: Path) -> None:
    """The control: Python's default SIGTERM ends the run with no teardown."""
    rc, marks = _run_and_stop(tmp_path)
    assert marks == "up\n"
    assert rc == -signal.SIGTERM
