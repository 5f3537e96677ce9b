"""Crash safety without fsync (docs/design.md, "Failure model").

A crash at any step of a prepare or an unprepare, then a restart (a new
preparer from what is on disk, start-up recovery), never leaves a prepared
claim without its CDI spec nor a spec without its claim, and the kubelet's
retry converges with nothing leaked. Start-up re-creates the spec of a
prepared claim from its record. A prepare+unprepare pair costs no fsync
(the budget is 2; the failure model needs none)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from driver.atomicfile import own_tag
from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore, ClaimState
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.faults import PREPARE_POINTS, UNPREPARE_POINTS
from tests.claims_doubles import NODE, FlakyHandler, OnceHandler, Reader

FSYNC_BUDGET = 2  # per prepare+unprepare pair (docs/design.md)


class Crash(BaseException):
    """The process dies here: no rollback, no answer (SIGKILL in production)."""


class Node:
    """One node's disk, hardware and API; ``start`` is a (re)started plugin."""

    def __init__(self, tmp: Path, side_effects: bool) -> None:
        self.tmp = tmp
        self.inventory = NodeInventory()
        self.inventory.replace_pool(
            NODE,
            [
                Device(name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}", attributes={"minor": i})
                for i in range(2)
            ],
        )
        self.reader = Reader()
        self.hardware = OnceHandler(tmp / "dev") if side_effects else FlakyHandler(tmp / "dev")
        self.cdi = CdiRegistry(tmp / "cdi")

    async def start(self) -> ClaimPreparer:
        store = CheckpointStore(self.tmp / "cp.json", "boot")
        prep = ClaimPreparer(self.reader, self.inventory, {"gpu": self.hardware}, store, self.cdi)
        await prep.recover()
        return prep

    def leftovers(self) -> list[Path]:
        """Temp debris: anything temp but this process's spares (the
        checkpoint's and the CDI directory's, kept for the next write)."""
        spares = {f".cp.json.tmp-{os.getpid()}", f".k8s.patchbay.dev-claim.spare.tmp-{own_tag()}"}
        return [p for p in self.tmp.rglob("*") if ".tmp-" in p.name and p.name not in spares]

    def on_disk(self) -> dict[str, str]:
        """Claim UID -> state, as a restarted plugin reads the checkpoint (the
        file and its journal)."""
        read = CheckpointStore(self.tmp / "cp.json", "boot").load()
        return {uid: str(rec.state) for uid, rec in read.claims.items()}


def crash_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    def crash_point(name: str) -> None:
        if name == point:
            raise Crash(name)

    monkeypatch.setattr("driver.claims.preparer.crash_point", crash_point)


@pytest.mark.parametrize("side_effects", [False, True], ids=["cdi-only", "hardware"])
@pytest.mark.parametrize("point", PREPARE_POINTS + UNPREPARE_POINTS)
async def test_crash_between_any_two_steps_converges(
    point: str, side_effects: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, side_effects)
    ref = node.reader.add("c", ["gpu-0", "gpu-1"])
    first = await node.start()
    crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        if point in UNPREPARE_POINTS:
            assert (await first.prepare([ref]))[ref.uid].error == ""
            await first.unprepare([ref])
        else:
            await first.prepare([ref])
    monkeypatch.undo()

    again = await node.start()
    states = node.on_disk()
    specs = node.cdi.claim_uids()
    # A prepared claim has its spec, and no spec outlives its claim's record.
    assert {u for u, s in states.items() if s == ClaimState.PREPARE_COMPLETED} <= specs
    assert specs <= set(states)
    # The kubelet retries the call that crashed (a prepare first if it was one).
    if point in PREPARE_POINTS:
        res = (await again.prepare([ref]))[ref.uid]
        assert res.error == "" and [d.device_name for d in res.devices] == ["gpu-0", "gpu-1"]
        assert node.cdi.claim_uids() == {ref.uid}
        assert node.on_disk() == {ref.uid: ClaimState.PREPARE_COMPLETED}
    assert (await again.unprepare([ref]))[ref.uid] == ""
    assert node.cdi.claim_uids() == set() and node.on_disk() == {}
    assert node.hardware.active == set()
    assert node.leftovers() == []


async def test_startup_recreates_the_spec_of_a_prepared_claim(tmp_path: Path) -> None:
    node = Node(tmp_path, side_effects=False)
    ref = node.reader.add("c", ["gpu-1"])
    first = await node.start()
    assert (await first.prepare([ref]))[ref.uid].error == ""
    spec = node.cdi.spec_path(ref.uid)
    written = spec.read_text()
    spec.unlink()  # e.g. a CDI root that did not survive, or an operator's cleanup
    again = await node.start()
    assert spec.read_text() == written
    assert json.loads(written)["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-1"]
    # And the claim is still served from the checkpoint without an API read.
    reads = node.reader.reads
    assert (await again.prepare([ref]))[ref.uid].error == ""
    assert node.reader.reads == reads


async def test_a_record_without_a_spec_copy_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path, side_effects=False)
    ref = node.reader.add("c", ["gpu-0"])
    first = await node.start()
    await first.prepare([ref])
    await first.compact()  # the whole file, as at rest
    # A record of an older version (no spec copy) whose spec went missing.
    raw = json.loads((tmp_path / "cp.json").read_text())
    del raw["claims"][ref.uid]["cdi_spec"]
    (tmp_path / "cp.json").write_text(json.dumps(raw))
    node.cdi.spec_path(ref.uid).unlink()
    prep = ClaimPreparer(
        node.reader,
        node.inventory,
        {"gpu": node.hardware},
        CheckpointStore(tmp_path / "cp.json", "boot"),
        node.cdi,
    )
    assert await prep.recover() == (0, 0)
    assert f"claim {ref.uid}: its CDI spec is missing" in caplog.text


@pytest.mark.parametrize("side_effects", [False, True], ids=["cdi-only", "hardware"])
async def test_fsyncs_per_prepare_unprepare_pair(
    side_effects: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, side_effects)
    prep = await node.start()
    refs = [node.reader.add(f"c{i}", [f"gpu-{i % 2}"]) for i in range(4)]
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    for ref in refs:
        assert (await prep.prepare([ref]))[ref.uid].error == ""
        assert (await prep.unprepare([ref]))[ref.uid] == ""
    per_pair = len(calls) / len(refs)
    assert per_pair <= FSYNC_BUDGET
    # What the failure model needs: none (a reboot drops the checkpoint).
    assert calls == []
