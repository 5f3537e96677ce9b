"""The preparer's index of what recorded claims hold (driver/claims/plan.py,
``Holdings``): a prepare looks up its own devices instead of reading every
record on the node, and the index follows records as they come and go and
when the checkpoint is read again from disk."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import pytest

from driver import checkpoint as checkpoint_module
from driver import holdings as holdings_module
from driver.claims import plan
from tests.bench.checkpoint_bench import node


async def test_a_prepare_reads_no_other_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("driver.gpu").setLevel(logging.ERROR)
    reader, preparer, _, names = node(tmp_path, 51)
    held = [reader.add(f"held-{i}", [names[i]]) for i in range(50)]
    assert all(not r.error for r in (await preparer.prepare(held)).values())
    read: list[str] = []
    original = holdings_module.record_holdings

    def counting(
        claim: checkpoint_module.ClaimRecord, kinds: Collection[str]
    ) -> list[holdings_module.Holding]:
        read.append(claim.uid)
        return original(claim, kinds)

    monkeypatch.setattr(plan, "record_holdings", counting)
    extra = reader.add("extra", [names[50]])
    assert not (await preparer.prepare([extra]))[extra.uid].error
    assert read == [extra.uid], "only the new claim's own record is indexed"
    # A device another claim holds is still refused, named with its holder.
    again = reader.add("again", [names[3]])
    error = (await preparer.prepare([again]))[again.uid].error
    assert f"already prepared for claim {held[3].uid}" in error
    # Unprepared, the device is free again.
    await preparer.unprepare([held[3]])
    assert not (await preparer.prepare([again]))[again.uid].error


async def test_the_index_follows_a_checkpoint_read_again(tmp_path: Path) -> None:
    logging.getLogger("driver.gpu").setLevel(logging.ERROR)
    reader, preparer, store, names = node(tmp_path, 3)
    first = reader.add("first", [names[0]])
    assert not (await preparer.prepare([first]))[first.uid].error
    # As a rolling update's other plugin: the file read again holds more.
    other = store.load()
    preparer.checkpoint = other
    del other.claims[first.uid]
    second = reader.add("second", [names[0]])
    assert not (await preparer.prepare([second]))[second.uid].error
