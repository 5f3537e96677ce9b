"""A rollback: the previous release reads only the checkpoint file (format
1), never the journal. Its own reading code (tests/previous_release, frozen)
over what today's build leaves: after a compaction at rest, a graceful stop
or a start, every record as today's build holds it; after a crash, the file
as of the last compaction (docs/design.md, "Upgrades and downgrades")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.checkpoint import CheckpointStore
from driver.claims import compaction
from tests.previous_release.checkpoint import CheckpointStore as PreviousStore
from tests.upgrade_node import BOOT_ID, CLAIMS, UpgradeNode, ref

PREPARED = ("whole-gpu", "mig", "vf")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[UpgradeNode]:
    node = UpgradeNode(tmp_path)
    node.backend.init()
    with node.host.effects_watcher():
        yield node


def as_today(node: UpgradeNode) -> dict[str, str]:
    cp = CheckpointStore(node.checkpoint_path, BOOT_ID).load()
    return {uid: r.model_dump_json() for uid, r in cp.claims.items()}


def as_previous(node: UpgradeNode) -> dict[str, str]:
    store = PreviousStore(node.checkpoint_path, BOOT_ID)
    cp = store.load()
    assert store.moved_aside is None, "the previous release would move the file aside"
    return {uid: r.model_dump_json() for uid, r in cp.claims.items()}


async def test_at_rest_the_previous_release_reads_every_record(
    node: UpgradeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compaction, "COMPACT_AT_REST_S", 0.0)
    prep = node.preparer()
    await prep.recover()
    results = await prep.prepare([ref(name) for name in PREPARED])
    assert all(not r.error for r in results.values())
    assert set(as_previous(node)) != set(as_today(node)), "the journal holds the change"
    await asyncio.wait_for(prep.rest.ran.wait(), timeout=30)  # a timer, then a task
    assert as_previous(node) == as_today(node)
    assert set(as_today(node)) == {CLAIMS[name][0] for name in PREPARED}


async def test_after_a_crash_a_start_makes_the_file_current(node: UpgradeNode) -> None:
    prep = node.preparer()
    await prep.recover()
    await prep.prepare([ref("whole-gpu"), ref("mig")])
    await prep.unprepare([ref("whole-gpu")])
    # The plugin is killed here: no compaction at rest, no graceful stop.
    # What the previous release would read now: the file as last compacted,
    # at the start, which holds neither claim prepared since.
    assert as_previous(node) == {} and set(as_today(node)) == {CLAIMS["mig"][0]}
    restarted = node.preparer()
    await restarted.recover()  # today's build started once: the file is current
    assert as_previous(node) == as_today(node)
    assert set(as_today(node)) == {CLAIMS["mig"][0]}


async def test_a_graceful_stop_leaves_the_file_current(node: UpgradeNode) -> None:
    prep = node.preparer()
    await prep.recover()
    await prep.prepare([ref("vf")])
    await prep.compact()  # what the plugin does once its servers stopped
    assert as_previous(node) == as_today(node) and set(as_today(node)) == {CLAIMS["vf"][0]}
