"""The spare file opened ahead of a write (driver/sparefile.py): the write
uses it, and whatever happened to the spare meanwhile, the file written
holds its data and nothing else is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driver.sparefile import Spare


def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = os.open

    def counting(path: Any, *args: Any, **kwargs: Any) -> int:
        seen.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return seen


def test_a_write_after_open_ahead_starts_with_the_spare_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spare = Spare(tmp_path, "x.spare.tmp")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    spare.create(a, b"old claim a, longer than the next")
    assert spare.retire(a) and spare.path.exists()  # its inode is the spare now
    inode = spare.path.stat().st_ino
    seen = opens(monkeypatch)
    spare.open_ahead()
    spare.open_ahead()  # held already: nothing
    assert seen == [str(spare.path)]
    spare.create(b, b"claim b")
    assert seen == [str(spare.path)], "the write opened nothing"
    assert b.read_bytes() == b"claim b" and b.stat().st_ino == inode
    assert not spare.path.exists()
    spare.create(a, b"claim a")  # nothing opened ahead: as before
    assert a.read_bytes() == b"claim a" and seen.count(str(spare.path)) == 2


def test_a_spare_removed_after_it_was_opened_is_written_without(tmp_path: Path) -> None:
    spare = Spare(tmp_path, "x.spare.tmp")
    spare.open_ahead()
    spare.path.unlink()  # an operator's cleanup
    spare.create(tmp_path / "a.json", b"claim a")
    assert (tmp_path / "a.json").read_bytes() == b"claim a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_retire_beside_an_open_spare_removes_the_file(tmp_path: Path) -> None:
    spare = Spare(tmp_path, "x.spare.tmp")
    spare.create(tmp_path / "a.json", b"claim a")
    spare.open_ahead()  # an empty spare, open
    assert spare.retire(tmp_path / "a.json")  # a spare exists: a plain removal
    spare.create(tmp_path / "b.json", b"claim b")
    assert (tmp_path / "b.json").read_bytes() == b"claim b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


def test_open_ahead_waits_for_no_write_and_fails_silently(tmp_path: Path) -> None:
    spare = Spare(tmp_path / "missing", "x.spare.tmp")
    spare.open_ahead()  # no directory yet: the write meets that itself
    spare.create(tmp_path / "missing" / "a.json", b"a")
    assert (tmp_path / "missing" / "a.json").read_bytes() == b"a"
    with spare._lock:  # a write under way in another thread
        spare.open_ahead()
    assert not spare.path.exists(), "nothing opened beside a write"


# A plugin process that sees itself as pid 1 (a pod in a PID namespace of its
# own, as the chart runs it without hostPID): it opens the spare ahead, says
# so, and writes its claim's file once told to.
_POD = """
import os, sys
os.getpid = lambda: 1
from pathlib import Path
from driver.sparefile import Spare
spare = Spare(Path(sys.argv[1]), "x.spare.tmp")
spare.open_ahead()
print("open", flush=True)
sys.stdin.readline()
spare.create(Path(sys.argv[1]) / sys.argv[2], sys.argv[3].encode())
"""


def test_two_processes_with_one_pid_never_write_into_each_others_file(tmp_path: Path) -> None:
    """A rolling update: the old pod opened its spare ahead (a prepare waiting
    for its GET) while the new pod, holding the claim lock, writes a claim.
    Were spares named by pid alone, both would be ``.x.spare.tmp-1`` and the
    old pod's write would land in the new pod's file."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # the repository
    run = [sys.executable, "-c", _POD, str(tmp_path)]
    old = subprocess.Popen(
        [*run, "a.json", "claim a"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert old.stdout is not None and old.stdout.readline() == b"open\n"
    new = subprocess.run([*run, "b.json", "claim b"], input=b"\n", env=env, timeout=60)
    assert new.returncode == 0
    old.communicate(b"\n", timeout=60)
    assert old.returncode == 0
    assert (tmp_path / "b.json").read_bytes() == b"claim b"
    assert (tmp_path / "a.json").read_bytes() == b"claim a"
