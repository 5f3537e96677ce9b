"""The spare file opened ahead of a write (driver/sparefile.py): the write
uses it, and whatever happened to the spare meanwhile, the file written
holds its data and nothing else is touched."""

from __future__ import annotations

import os
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
