"""A checkpoint save serialises the records that changed, not every claim on
the node, and still writes the whole model as every build reads it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, ClaimState, DeviceRecord


def record(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    device = DeviceRecord(
        request_names=["gpu"], pool_name="n1", device_name="gpu-0", kind="gpu", local_id="GPU-0"
    )
    spec = {"cdiVersion": "0.6.0", "kind": "k8s.patchbay.dev/claim", "devices": []}
    return ClaimRecord(
        uid=uid, namespace="ns", name="c", state=state, devices=[device], cdi_spec=spec
    )


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The claim records serialised, by UID."""
    seen: list[str] = []
    original = ClaimRecord.model_dump_json

    def counting(self: ClaimRecord, **kwargs: Any) -> str:
        seen.append(self.uid)
        return original(self, **kwargs)

    monkeypatch.setattr(ClaimRecord, "model_dump_json", counting)
    return seen


def test_a_save_serialises_only_what_changed(tmp_path: Path, dumps: list[str]) -> None:
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    checkpoint = store.load()
    held = [str(uuid.uuid4()) for _ in range(100)]
    checkpoint.claims.update({uid: record(uid) for uid in held})
    store.save(checkpoint)
    assert sorted(dumps) == sorted(held)
    dumps.clear()
    new = str(uuid.uuid4())
    checkpoint.claims[new] = record(new, ClaimState.PREPARE_STARTED)
    store.save(checkpoint)
    assert dumps == [new], "a completed record is written as it was"
    checkpoint.claims[new].state = ClaimState.PREPARE_COMPLETED  # as the preparer completes
    store.save(checkpoint)
    del checkpoint.claims[held[0]]
    store.save(checkpoint)
    assert dumps == [new, new]
    replaced = record(held[1])  # a new record object under a known UID is written anew
    checkpoint.claims[held[1]] = replaced
    store.save(checkpoint)
    assert dumps == [new, new, held[1]]
    # What is on disk is the whole model, as one dump of it writes it.
    on_disk = json.loads(store.path.read_bytes())
    assert on_disk == json.loads(Checkpoint.model_dump_json(checkpoint))
    assert set(on_disk["claims"]) == (set(held) - {held[0]}) | {new}


def test_unknown_fields_of_newer_builds_are_written_back(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    uid = str(uuid.uuid4())
    newer = json.loads(record(uid).model_dump_json())
    newer["perClaimFile"] = "claims/x.json"
    path.write_text(
        json.dumps({"version": 2, "boot_id": "boot", "claims": {uid: newer}, "layout": "v2"})
    )
    store = CheckpointStore(path, "boot")
    store.save(store.load())
    written = json.loads(path.read_bytes())
    assert written["layout"] == "v2" and written["version"] == 2
    assert written["claims"][uid]["perClaimFile"] == "claims/x.json"
