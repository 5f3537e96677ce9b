"""The preparer's index of what recorded claims hold (driver/claims/plan.py,
``Holdings``): a prepare looks up its own devices instead of reading every
record on the node, and the index follows records as they come and go and
when the checkpoint is read again from disk."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver import checkpoint as checkpoint_module
from driver import holdings as holdings_module
from driver.claims import plan
from driver.claims.preparer import ClaimPreparer
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


class CountingClaims(dict[str, checkpoint_module.ClaimRecord]):
    """The checkpoint's records, counting every walk over them."""

    walks = 0

    def values(self) -> Any:
        CountingClaims.walks += 1
        return super().values()

    def items(self) -> Any:
        CountingClaims.walks += 1
        return super().items()

    def keys(self) -> Any:
        CountingClaims.walks += 1
        return super().keys()

    def __iter__(self) -> Iterator[str]:
        CountingClaims.walks += 1
        return super().__iter__()


def scanned(preparer: ClaimPreparer) -> set[tuple[str, str]]:
    """What every record names, read the slow way (as before the index)."""
    records = dict.values(preparer.checkpoint.claims)
    return {(d.kind, d.local_id) for c in records for d in c.devices}


async def test_prepared_devices_reads_no_record(tmp_path: Path) -> None:
    """Asked after every call (the fabric report) and at every metrics
    scrape: the held devices come from the index, at 1000 claims too."""
    logging.getLogger("driver.gpu").setLevel(logging.ERROR)
    reader, preparer, _, names = node(tmp_path, 1002)
    held = [reader.add(f"held-{i}", [names[i]]) for i in range(1000)]
    for i in range(0, 1000, 100):
        results = await preparer.prepare(held[i : i + 100])
        assert all(not r.error for r in results.values())
    # An admin-access view names its device too (a container uses it).
    view = reader.add("view", [names[0]])
    reader.claims[("ns", "view")]["status"]["allocation"]["devices"]["results"][0][
        "adminAccess"
    ] = True
    assert not (await preparer.prepare([view]))[view.uid].error
    preparer.checkpoint.claims = CountingClaims(preparer.checkpoint.claims)
    CountingClaims.walks = 0
    devices = preparer.prepared_devices()
    assert CountingClaims.walks == 0, "prepared_devices walked the records"
    assert devices == scanned(preparer) and len(devices) == 1000
    # The index follows records as they come and go: the view's GPU stays held
    # while one claim still names it; a device freed leaves, a new one comes.
    await preparer.unprepare([held[0], held[1]])
    extra = reader.add("extra", [names[1001]])
    assert not (await preparer.prepare([extra]))[extra.uid].error
    CountingClaims.walks = 0
    devices = preparer.prepared_devices()
    assert CountingClaims.walks == 0
    assert devices == scanned(preparer) and len(devices) == 1000
    gpu = preparer.checkpoint.claims[extra.uid].devices[0]
    assert ("gpu", gpu.local_id) in devices
    await preparer.unprepare([view])
    assert preparer.prepared_devices() == scanned(preparer) and len(scanned(preparer)) == 999
