"""The checkpoint's journal (driver/journal.py): a prepare's write is one
appended entry, not the whole file; a restart replays it; a compaction
writes the whole file and removes it; torn and foreign entries are skipped."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from driver import checkpoint as checkpoint_module
from driver.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from driver.journal import journal_path


@pytest.fixture(autouse=True)
def compaction_at_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction as soon as the journal holds as many entries as the node
    has claims, however few (a node compacts at COMPACT_FROM entries at the
    earliest; the small node's test sets it back)."""
    monkeypatch.setattr(checkpoint_module, "COMPACT_FROM", 0)


def record(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    device = DeviceRecord(
        request_names=["gpu"], pool_name="n1", device_name="gpu-0", kind="gpu", local_id="GPU-0"
    )
    return ClaimRecord(uid=uid, namespace="ns", name="c", state=state, devices=[device])


def filled(tmp_path: Path, claims: int) -> tuple[CheckpointStore, Checkpoint, list[str]]:
    """A store whose file holds ``claims`` completed records, journal empty."""
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    checkpoint = store.load()
    held = [str(uuid.uuid4()) for _ in range(claims)]
    checkpoint.claims.update({uid: record(uid) for uid in held})
    store.save(checkpoint)
    return store, checkpoint, held


def test_a_change_is_one_entry_and_a_restart_replays_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, checkpoint, held = filled(tmp_path, 100)
    file_before = store.path.stat()
    dumped: list[str] = []
    original = ClaimRecord.model_dump_json

    def counting(self: ClaimRecord, **kwargs: Any) -> str:
        dumped.append(self.uid)
        return original(self, **kwargs)

    monkeypatch.setattr(ClaimRecord, "model_dump_json", counting)
    new = str(uuid.uuid4())
    checkpoint.claims[new] = record(new, ClaimState.PREPARE_STARTED)
    store.record(checkpoint, new)
    checkpoint.claims[new].state = ClaimState.PREPARE_COMPLETED
    store.record(checkpoint, new)
    del checkpoint.claims[held[0]]
    store.record(checkpoint, held[0])
    assert dumped == [new, new], "only the changed record is serialised"
    after = store.path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        file_before.st_ino, file_before.st_size, file_before.st_mtime_ns,
    ), "the file is not rewritten"  # fmt: skip
    lines = store.journal.read_bytes().split(b"\n")
    assert lines[0] == b"" and len(lines) == 4 and store.pending == 3
    restarted = CheckpointStore(store.path, "boot").load()
    assert set(restarted.claims) == (set(held) - {held[0]}) | {new}
    assert restarted.claims[new].state is ClaimState.PREPARE_COMPLETED


def test_compaction_writes_the_whole_file_and_removes_the_journal(tmp_path: Path) -> None:
    store, checkpoint, held = filled(tmp_path, 5)
    for uid in held[:2]:
        del checkpoint.claims[uid]
        store.record(checkpoint, uid)
    assert store.journal.exists() and store.pending == 2
    # Due once the journal holds as many entries as the node has claims.
    del checkpoint.claims[held[2]]
    store.record(checkpoint, held[2])
    assert not store.journal.exists() and store.pending == 0
    assert set(json.loads(store.path.read_bytes())["claims"]) == set(held[3:])
    new = str(uuid.uuid4())
    checkpoint.claims[new] = record(new)
    store.record(checkpoint, new)
    assert store.compact(checkpoint) and not store.journal.exists()
    assert set(json.loads(store.path.read_bytes())["claims"]) == {*held[3:], new}
    assert not store.compact(checkpoint), "nothing pending, nothing written"


def test_a_crash_between_the_file_and_the_journal_removal_replays_harmlessly(
    tmp_path: Path,
) -> None:
    store, checkpoint, held = filled(tmp_path, 5)
    del checkpoint.claims[held[0]]
    store.record(checkpoint, held[0])
    kept = store.journal.read_bytes()
    store.save(checkpoint)
    store.journal.write_bytes(kept)  # the removal never happened
    read = CheckpointStore(store.path, "boot").load()
    assert set(read.claims) == set(held[1:])


def test_torn_and_other_boot_entries_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, checkpoint, held = filled(tmp_path, 5)
    gone, new = held[0], str(uuid.uuid4())
    del checkpoint.claims[gone]
    store.record(checkpoint, gone)
    with store.journal.open("ab") as f:  # a crash in the middle of an entry
        f.write(b'\n{"boot":"boot","uid":"' + new.encode() + b'","record":{"uid":')
    later = str(uuid.uuid4())
    restarted = CheckpointStore(store.path, "boot")
    cp = restarted.load()
    assert new not in cp.claims and gone not in cp.claims
    assert "a torn write" in caplog.text
    cp.claims[later] = record(later)
    restarted.record(cp, later)  # its own line, after the torn one
    assert later in CheckpointStore(store.path, "boot").load().claims
    # After a reboot the file's records and the journal's entries are dropped.
    assert CheckpointStore(store.path, "other-boot").load().claims == {}
    rebooted = CheckpointStore(store.path, "other-boot")
    cp = rebooted.load()
    cp.claims[new] = record(new)
    rebooted.record(cp, new)
    assert set(CheckpointStore(store.path, "other-boot").load().claims) == {new}


def test_another_process_sees_each_entry(tmp_path: Path) -> None:
    ours, checkpoint, _ = filled(tmp_path, 5)
    theirs = CheckpointStore(ours.path, "boot")
    theirs.load()
    assert not theirs.changed()
    new = str(uuid.uuid4())
    checkpoint.claims[new] = record(new)
    ours.record(checkpoint, new)
    assert not ours.changed(), "its own entry is not a change to re-read"
    assert theirs.changed() and new in theirs.load().claims
    assert journal_path(ours.path).name == "cp.json.journal"


def test_the_first_entry_creates_the_directory(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "plugin" / "cp.json", "boot")
    checkpoint = store.load()
    uid, other = str(uuid.uuid4()), str(uuid.uuid4())
    checkpoint.claims.update({uid: record(uid), other: record(other)})  # 2 claims: no compaction
    store.record(checkpoint, uid)
    assert store.journal.exists() and not store.path.exists()
    assert uid in CheckpointStore(store.path, "boot").load().claims


def test_a_small_node_journals_too_and_compacts_at_compact_from_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_module, "COMPACT_FROM", 16)
    store, checkpoint, held = filled(tmp_path, 2)
    changed = [str(uuid.uuid4()) for _ in range(17)]
    for n, uid in enumerate(changed[:16], start=1):  # 3 claims, then 2, then 3...
        if n % 2:
            checkpoint.claims[uid] = record(uid)
        else:
            del checkpoint.claims[changed[n - 2]]
            uid = changed[n - 2]
        store.record(checkpoint, uid)
        assert store.pending == n, "a change is an entry, however few the claims"
    assert set(json.loads(store.path.read_bytes())["claims"]) == set(held)
    checkpoint.claims[changed[16]] = record(changed[16])
    store.record(checkpoint, changed[16])  # the journal holds 16: a compaction instead
    assert store.pending == 0 and not store.journal.exists()
    assert set(json.loads(store.path.read_bytes())["claims"]) == set(checkpoint.claims)


def test_a_store_alone_on_its_files_holds_the_journal_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "cp.json", "boot", shared=False)
    checkpoint = store.load()
    held = [str(uuid.uuid4()) for _ in range(10)]
    checkpoint.claims.update({uid: record(uid) for uid in held})
    store.save(checkpoint)
    opened: list[str] = []
    real_open = os.open

    def counting(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    for uid in held[:3]:
        del checkpoint.claims[uid]
        store.record(checkpoint, uid)
    assert opened == [str(store.journal)] and store.pending == 3, "opened for the first only"
    # A compaction removes the journal: the next entry goes to a new one,
    # not to the removed file.
    assert store.compact(checkpoint) and not store.journal.exists()
    new = str(uuid.uuid4())
    checkpoint.claims[new] = record(new)
    store.record(checkpoint, new)
    assert opened.count(str(store.journal)) == 2 and store.journal.exists()
    assert set(CheckpointStore(store.path, "boot").load().claims) == {*held[3:], new}
