"""The tiers' run directories (tests/run_dirs.py): removed after a passing
session, kept and named after a failing one, never removed through a mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import run_dirs


def a_run_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    (path / "logs").mkdir(parents=True)
    (path / "logs" / "kubelet.log").write_text("the log a reader needs\n")
    return path


def test_a_passing_session_removes_its_run_dirs(tmp_path: Path) -> None:
    one, two = a_run_dir(tmp_path, "pbe-1"), a_run_dir(tmp_path, "pb-node-0")
    assert run_dirs.leave([one, two], passed=True, keep=False) == []
    assert not one.exists() and not two.exists()


def test_a_failing_session_keeps_them_and_says_where(tmp_path: Path) -> None:
    path = a_run_dir(tmp_path, "pbe-1")
    lines = run_dirs.leave([path], passed=False, keep=False)
    assert lines == [f"kept the run directory {path} (a test failed): its logs are there"]
    assert (path / "logs" / "kubelet.log").read_text() == "the log a reader needs\n"


def test_keep_keeps_them_after_a_pass(tmp_path: Path) -> None:
    path = a_run_dir(tmp_path, "pbe-1")
    lines = run_dirs.leave([path], passed=True, keep=True)
    assert lines and run_dirs.KEEP_ENV in lines[0]
    assert path.is_dir()


def test_a_dir_with_a_mount_below_is_never_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = a_run_dir(tmp_path, "pb-node-0")
    below = str(path / "rootfs")
    monkeypatch.setattr(run_dirs, "mounts_below", lambda p: [below] if p == path else [])
    lines = run_dirs.leave([path], passed=True, keep=False)
    assert lines == [f"kept the run directory {path}: mounted below it: {below}"]
    assert path.is_dir()


def test_mounts_below_reads_the_mount_table(tmp_path: Path) -> None:
    assert "/proc" in run_dirs.mounts_below(Path("/proc"))
    assert run_dirs.mounts_below(a_run_dir(tmp_path, "plain")) == []


def test_a_gone_dir_is_no_error(tmp_path: Path) -> None:
    assert run_dirs.leave([tmp_path / "never-made"], passed=False, keep=False) == []
