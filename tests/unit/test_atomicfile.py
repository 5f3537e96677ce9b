"""Atomic replacement without fsync: the swap, its fallback, and its debris."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver import atomicfile
from driver.atomicfile import create_from_spare, exchange, remove_stale_temps, retire, write_atomic


def test_replaces_and_creates_leaving_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "cp.json"
    write_atomic(target, b"one", mode=0o600)  # no target (nor directory) yet: a rename
    write_atomic(target, b"two", mode=0o600)  # an existing target: the exchange
    assert target.read_bytes() == b"two"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["cp.json"]


def test_exchange_swaps_two_names(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("new")
    b.write_text("old")
    if not exchange(a, b):
        pytest.skip("no RENAME_EXCHANGE on this file system")
    assert (a.read_text(), b.read_text()) == ("old", "new")
    assert exchange(a, tmp_path / "missing") is False  # nothing to swap with: the caller renames


def test_without_exchange_a_plain_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomicfile, "exchange", lambda a, b: False)
    target = tmp_path / "cp.json"
    for content in (b"one", b"two"):
        write_atomic(target, content)
    assert target.read_bytes() == b"two" and names(tmp_path) == ["cp.json"]


def test_between_the_swap_and_the_unlink_the_target_is_new_and_the_temp_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a crash right after the swap leaves: the new content in place and
    the old in the temp, which start-up removes as debris."""
    target = tmp_path / "cp.json"
    write_atomic(target, b"old")
    real = atomicfile.exchange
    seen: list[tuple[bytes, bytes]] = []

    def swap_and_look(a: Path, b: Path) -> bool:
        if not real(a, b):
            pytest.skip("no RENAME_EXCHANGE on this file system")
        seen.append((b.read_bytes(), a.read_bytes()))
        return True

    monkeypatch.setattr(atomicfile, "exchange", swap_and_look)
    write_atomic(target, b"new")
    assert seen == [(b"new", b"old")]
    assert target.read_bytes() == b"new" and names(tmp_path) == ["cp.json"]
    (tmp_path / f".cp.json.tmp-{os.getpid()}").write_bytes(b"old")  # the debris a crash leaves
    assert remove_stale_temps(tmp_path) == 1 and names(tmp_path) == ["cp.json"]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_files_created_and_retired_through_one_spare_reuse_its_inode(tmp_path: Path) -> None:
    probe_a, probe_b = tmp_path / "pa", tmp_path / "pb"
    probe_a.touch()
    probe_b.touch()
    if not exchange(probe_a, probe_b):
        pytest.skip("no renameat2 flags on this file system")
    probe_a.unlink()
    probe_b.unlink()
    spare = tmp_path / ".x.spare.tmp-1"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    create_from_spare(a, b"claim a", spare)
    inode = a.stat().st_ino
    assert names(tmp_path) == ["a.json"]  # the spare became the file
    assert retire(a, spare) is True and retire(a, spare) is False
    assert names(tmp_path) == [spare.name]  # its inode waits as the spare
    create_from_spare(b, b"b", spare)
    assert b.read_bytes() == b"b" and b.stat().st_ino == inode  # no inode made
    create_from_spare(b, b"b again", spare)  # an existing file is replaced whole
    assert b.read_bytes() == b"b again"
    create_from_spare(a, b"a", spare)
    assert retire(a, spare) and retire(b, spare)  # a spare exists already: plain removal
    assert names(tmp_path) == [spare.name]
