"""Syscalls a prepare + unprepare pair of a whole GPU does not need (issue 36).

- The process id: glibc does not cache ``getpid``, and the names of the
  temp files and spares of the checkpoint, the CDI spec and the device
  metadata files (``driver.atomicfile.own_pid``) took one syscall at every
  write; a forked child still names its own.
- The checkpoint's identity (a ``stat`` of the file after each save, an
  ``fstat`` of the journal after each entry): kept only when another
  process may write the checkpoint (a rolling update), to notice its writes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from driver.atomicfile import own_pid
from driver.checkpoint import CheckpointStore
from driver.claims.metadata_files import MetadataFiles
from driver.claims.preparer import ClaimPreparer
from tests.bench.checkpoint_bench import node


async def test_a_pair_calls_no_getpid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logging.getLogger("driver.gpu").setLevel(logging.ERROR)
    reader, plain, store, names = node(tmp_path, 2)
    # The plugin's preparer writes the device metadata files too (KEP-5304).
    preparer = ClaimPreparer(
        reader, plain._inventory, plain._handlers, store, plain._files.cdi,
        metadata=MetadataFiles.in_plugin_dir(tmp_path / "plugin"),
    )  # fmt: skip
    warm = reader.add("warm", [names[0]])
    assert not (await preparer.prepare([warm]))[warm.uid].error
    assert (await preparer.unprepare([warm]))[warm.uid] == ""
    calls: list[int] = []
    real = os.getpid

    def counted() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(os, "getpid", counted)
    ref = reader.add("pair", [names[1]])
    assert not (await preparer.prepare([ref]))[ref.uid].error
    assert list((tmp_path / "plugin").rglob(f"{ref.uid}*")), "the metadata file is written"
    assert (await preparer.unprepare([ref]))[ref.uid] == ""
    assert calls == [], f"{len(calls)} getpid calls in one pair"


def test_a_forked_child_names_its_own_files() -> None:
    assert own_pid() == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, str(own_pid() == os.getpid()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read() == b"True"
    assert os.waitpid(child, 0)[1] == 0


async def test_an_unshared_checkpoint_is_not_stat_after_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("driver.gpu").setLevel(logging.ERROR)
    reader, plain, _, names = node(tmp_path, 2)
    store = CheckpointStore(tmp_path / "own.json", "boot", shared=False)  # no rolling update
    preparer = ClaimPreparer(reader, plain._inventory, plain._handlers, store, plain._files.cdi)
    stats: list[str] = []
    real = os.stat

    def counted(path: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(str(path))
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counted)
    for i in range(2):
        ref = reader.add(f"c{i}", [names[i]])
        assert not (await preparer.prepare([ref]))[ref.uid].error
        assert (await preparer.unprepare([ref]))[ref.uid] == ""
    assert [p for p in stats if p.startswith(str(store.path))] == []
    assert store.journal.exists() and not store.changed()
