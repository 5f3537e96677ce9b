"""A checkpoint written by a newer build, read by this one (a downgrade, or a
rolling update's old pod): unknown fields survive a re-save at every level,
and a record whose state or device kind this build does not know is kept
untouched, its devices are refused to other claims, its unprepare fails with
an error that says why, and every other claim is served (docs/design.md,
"Upgrades and downgrades")."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore, ClaimState
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from tests.claims_doubles import NODE, FlakyHandler, Reader

BOOT = "boot"


def device(name: str, kind: str, local_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "request_names": ["req-0"],
        "pool_name": NODE,
        "device_name": name,
        "kind": kind,
        "local_id": local_id,
        "cdi_device_ids": [],
        "undo": {},
        **extra,
    }


def claim(uid: str, state: str, devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "uid": uid,
        "namespace": "ns",
        "name": f"c-{uid[:4]}",
        "state": state,
        "devices": devices,
        "updated": 1.0,
        "cdi_spec": None,
        **extra,
    }


def write(path: Path, claims: list[dict[str, Any]], **extra: Any) -> None:
    data = {"version": 2, "boot_id": BOOT, "claims": {c["uid"]: c for c in claims}, **extra}
    path.write_text(json.dumps(data))


def test_unknown_fields_at_every_level_survive_a_resave(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    uid = str(uuid.uuid4())
    dev = device("gpu-0", "gpu", "GPU-0", sharing={"slices": 4}, undo={"future": [1, 2]})
    write(path, [claim(uid, "PrepareCompleted", [dev], owner={"pod": "p"})], newTable={"a": 1})
    store = CheckpointStore(path, BOOT)
    store.save(store.load())
    again = json.loads(path.read_text())
    assert again["version"] == 2 and again["newTable"] == {"a": 1}
    assert again["claims"][uid]["owner"] == {"pod": "p"}
    saved_dev = again["claims"][uid]["devices"][0]
    assert saved_dev["sharing"] == {"slices": 4} and saved_dev["undo"] == {"future": [1, 2]}


def test_an_unknown_state_keeps_the_file_and_the_record(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    known, newer = str(uuid.uuid4()), str(uuid.uuid4())
    write(
        path,
        [
            claim(known, "PrepareCompleted", [device("gpu-0", "gpu", "GPU-0")]),
            claim(newer, "UnprepareStarted", [device("gpu-1", "gpu", "GPU-1")]),
        ],
    )
    store = CheckpointStore(path, BOOT)
    cp = store.load()
    assert store.moved_aside is None, "a newer state is not corruption"
    assert cp.claims[known].state is ClaimState.PREPARE_COMPLETED
    assert cp.claims[newer].state == "UnprepareStarted"
    store.save(cp)
    assert json.loads(path.read_text())["claims"][newer]["state"] == "UnprepareStarted"


class Node:
    """Three GPUs; GPU-1 and GPU-2 are held by records of a newer build."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.inventory = NodeInventory()
        self.inventory.replace_pool(
            NODE,
            [Device(f"gpu-{i}", "gpu", f"GPU-{i}", {"minor": i}) for i in range(4)],
        )
        self.reader = Reader()
        self.handler = FlakyHandler(tmp / "dev")
        self.cdi = CdiRegistry(tmp / "cdi")
        self.state_uid, self.kind_uid = str(uuid.uuid4()), str(uuid.uuid4())
        spec = self.cdi.claim_spec(self.kind_uid, [])
        self.cdi.write_spec(self.state_uid, self.cdi.claim_spec(self.state_uid, []))
        self.cdi.write_spec(self.kind_uid, spec)
        write(
            tmp / "cp.json",
            [
                claim(
                    self.state_uid,
                    "UnprepareStarted",
                    [device("gpu-1", "gpu", "GPU-1", detachAfter=30)],
                    unprepareStep=2,
                ),
                claim(
                    self.kind_uid,
                    "PrepareCompleted",
                    [device("gpu-2-slice-0", "gpu-slice", "GPU-2", undo={"slice": 0})],
                    cdi_spec=spec,
                ),
            ],
            sliceTable={"GPU-2": [0]},
        )
        self.before = (tmp / "cp.json").read_text()
        store = CheckpointStore(tmp / "cp.json", BOOT)
        self.prep = ClaimPreparer(
            self.reader, self.inventory, {"gpu": self.handler}, store, self.cdi
        )

    def ref(self, uid: str) -> ClaimRef:
        return ClaimRef("ns", f"c-{uid[:4]}", uid)

    def on_disk(self) -> dict[str, Any]:
        claims: dict[str, Any] = json.loads((self.tmp / "cp.json").read_text())["claims"]
        return claims


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_recovery_keeps_records_it_does_not_understand(node: Node) -> None:
    assert await node.prep.recover() == (0, 0)
    assert node.cdi.claim_uids() == {node.state_uid, node.kind_uid}
    assert set(node.prep.checkpoint.claims) == {node.state_uid, node.kind_uid}


async def test_unprepare_of_a_newer_record_fails_clearly_and_keeps_it(node: Node) -> None:
    results = await node.prep.unprepare([node.ref(node.state_uid), node.ref(node.kind_uid)])
    state_error, kind_error = results[node.state_uid], results[node.kind_uid]
    assert "state 'UnprepareStarted'" in state_error and "newer build" in state_error
    assert "device kind 'gpu-slice'" in kind_error and "newer build" in kind_error
    assert (node.tmp / "cp.json").read_text() == node.before, "records untouched"
    assert node.cdi.claim_uids() == {node.state_uid, node.kind_uid}, "specs untouched"


async def test_prepare_refuses_their_devices_and_serves_the_others(node: Node) -> None:
    over_state = node.reader.add("over-state", ["gpu-1"])
    over_kind = node.reader.add("over-kind", ["gpu-2"])
    free = node.reader.add("free", ["gpu-3"])
    results = await node.prep.prepare([over_state, over_kind, free])
    assert f"already prepared for claim {node.state_uid}" in results[over_state.uid].error
    assert f"already prepared for claim {node.kind_uid}" in results[over_kind.uid].error
    assert results[free.uid].error == "" and results[free.uid].devices
    assert (await node.prep.unprepare([free]))[free.uid] == ""
    on_disk = node.on_disk()
    assert set(on_disk) == {node.state_uid, node.kind_uid}
    assert on_disk == json.loads(node.before)["claims"], "records kept as written"
    saved = json.loads((node.tmp / "cp.json").read_text())
    assert saved["sliceTable"] == {"GPU-2": [0]} and saved["version"] == 2


async def test_prepare_of_the_newer_claim_itself_is_refused(node: Node) -> None:
    # The kubelet retries a prepare of a claim a newer build was working on.
    node.reader.claims[("ns", f"c-{node.state_uid[:4]}")] = {
        "metadata": {"namespace": "ns", "name": f"c-{node.state_uid[:4]}", "uid": node.state_uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": "patchbay.dev", "pool": NODE, "device": "gpu-1"}
                    ],
                    "config": [],
                }
            }
        },
    }
    error = (await node.prep.prepare([node.ref(node.state_uid)]))[node.state_uid].error
    assert "state 'UnprepareStarted'" in error and "newer build" in error
    assert node.handler.active == set(), "nothing undone or prepared over it"
    assert (node.tmp / "cp.json").read_text() == node.before
