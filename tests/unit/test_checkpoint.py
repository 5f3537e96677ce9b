"""Checkpoint: atomic writes, two-phase states, boot id reset, forward
compatibility and the way out of a corrupt file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, ClaimState, DeviceRecord

A, B = "0aaaaaaa-0000-4000-8000-000000000001", "0bbbbbbb-0000-4000-8000-000000000002"


def record(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    dev = DeviceRecord(
        request_names=["gpu"],
        pool_name="n1",
        device_name="gpu-0",
        kind="gpu",
        local_id="GPU-0",
        undo={"gi": 3},
    )
    return ClaimRecord(uid=uid, namespace="ns", name="c", state=state, devices=[dev])


def test_roundtrip_keeps_states_and_undo(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", "boot-1")
    cp = store.load()
    cp.claims[A] = record(A, ClaimState.PREPARE_STARTED)
    cp.claims[B] = record(B)
    store.save(cp)
    again = CheckpointStore(tmp_path / "cp.json", "boot-1").load()
    assert again.claims[A].state is ClaimState.PREPARE_STARTED
    assert again.claims[B].state is ClaimState.PREPARE_COMPLETED
    assert again.claims[B].devices[0].undo == {"gi": 3}
    assert not list(tmp_path.glob(".*tmp*")), "no temp file left behind"


def test_boot_id_change_drops_records(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", "boot-1")
    cp = store.load()
    cp.claims[A] = record(A)
    store.save(cp)
    assert CheckpointStore(tmp_path / "cp.json", "boot-2").load().claims == {}
    assert CheckpointStore(tmp_path / "cp.json", "boot-1").load().claims != {}


def test_newer_fields_are_read_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    data = Checkpoint(boot_id="b").model_dump(mode="json")
    data["version"] = 2
    data["futureField"] = {"x": 1}
    data["claims"] = {A: {**record(A).model_dump(mode="json"), "futureClaimField": 7}}
    path.write_text(json.dumps(data))
    store = CheckpointStore(path, "b")
    cp = store.load()
    assert cp.claims[A].name == "c"
    store.save(cp)
    saved = json.loads(path.read_text())
    assert saved["futureField"] == {"x": 1}
    assert saved["claims"][A]["futureClaimField"] == 7


def test_older_file_without_new_fields_loads(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    path.write_text(json.dumps({"boot_id": "b", "claims": {}}))
    assert CheckpointStore(path, "b").load().version == 1


def test_corrupt_file_is_moved_aside_not_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cp.json"
    path.write_text("{not json")
    store = CheckpointStore(path, "b")
    cp = store.load()
    assert cp.claims == {}
    assert store.moved_aside is not None and store.moved_aside.read_text() == "{not json"
    assert not path.exists()
    assert "corrupt" in caplog.text and str(store.moved_aside) in caplog.text


def test_stale_temp_from_crash_is_cleaned(tmp_path: Path) -> None:
    (tmp_path / ".cp.json.tmp-1234").write_text("half")
    store = CheckpointStore(tmp_path / "cp.json", "b")
    store.load()
    # Loading leaves it (another process may be saving right now)...
    assert (tmp_path / ".cp.json.tmp-1234").exists()
    # ... start-up recovery, under the claim lock, removes it.
    assert store.remove_debris() == 1
    assert not (tmp_path / ".cp.json.tmp-1234").exists()


def test_changed_only_when_another_writer_replaced_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    ours, theirs = CheckpointStore(path, "b"), CheckpointStore(path, "b")
    assert not ours.changed()  # no file yet, none read
    cp = ours.load()
    cp.claims[A] = record(A)
    ours.save(cp)
    assert not ours.changed(), "our own write is not a change"
    assert theirs.changed()
    other = theirs.load()
    assert not theirs.changed()
    other.claims[B] = record(B)
    theirs.save(other)
    assert ours.changed()
    assert set(ours.load().claims) == {A, B}
    assert not ours.changed()
    path.unlink()
    assert ours.changed()


def test_an_empty_file_starts_empty_without_a_corrupt_copy(tmp_path: Path) -> None:
    # What power loss can leave of an unsynced save (docs/design.md, "Failure model").
    path = tmp_path / "cp.json"
    path.write_bytes(b"")
    store = CheckpointStore(path, "b")
    assert store.load().claims == {} and store.moved_aside is None
