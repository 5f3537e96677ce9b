"""The claim lock's two modes (driver.claims.lock): keyed holds of different
keys run side by side, of one key take turns; the whole lock waits for every
keyed hold to leave and keeps new ones out; a cancelled wait leaves nothing
held; a lock shared with another process (a lock file) is always whole."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from driver.claims.lock import ClaimLock, KeyedHold

Log = list[str]


async def hold(lock: ClaimLock, keys: list[str] | None, name: str, log: Log,
               release: asyncio.Event) -> None:  # fmt: skip
    async with lock.keyed(keys):
        log.append(f"in {name}")
        await release.wait()
        log.append(f"out {name}")


async def settle() -> None:
    for _ in range(10):  # lets every ready task run up to its next wait
        await asyncio.sleep(0)


async def test_different_keys_together_one_key_in_turn() -> None:
    lock, log = ClaimLock(), Log()
    go = {n: asyncio.Event() for n in "abc"}
    tasks = [
        asyncio.create_task(hold(lock, ["claim:a", "GPU-0"], "a", log, go["a"])),
        asyncio.create_task(hold(lock, ["claim:b", "GPU-1"], "b", log, go["b"])),
        asyncio.create_task(hold(lock, ["claim:c", "GPU-0"], "c", log, go["c"])),
    ]
    await settle()
    assert log == ["in a", "in b"], "b on another GPU runs beside a; c waits for GPU-0"
    go["c"].set()
    go["a"].set()
    await settle()
    assert log == ["in a", "in b", "out a", "in c", "out c"]
    go["b"].set()
    await asyncio.gather(*tasks)
    assert lock._keys == {} and lock._active == 0  # nothing left behind


async def test_whole_waits_for_keyed_and_keeps_new_ones_out() -> None:
    lock, log = ClaimLock(), Log()
    a_go, b_go, whole_go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    a = asyncio.create_task(hold(lock, ["GPU-0"], "a", log, a_go))
    await settle()
    whole = asyncio.create_task(hold(lock, None, "whole", log, whole_go))
    await settle()
    b = asyncio.create_task(hold(lock, ["GPU-1"], "b", log, b_go))
    await settle()
    assert log == ["in a"], "the whole lock waits for a; b, on a free key, waits behind it"
    a_go.set()
    await settle()
    assert log == ["in a", "out a", "in whole"]
    whole_go.set()
    b_go.set()
    await asyncio.gather(a, whole, b)
    assert log[-2:] == ["in b", "out b"]


async def test_a_cancelled_wait_leaves_nothing_held() -> None:
    lock, log = ClaimLock(), Log()
    first_go = asyncio.Event()
    first = asyncio.create_task(hold(lock, ["GPU-0", "GPU-1"], "first", log, first_go))
    await settle()
    waiting = asyncio.create_task(hold(lock, ["GPU-1", "GPU-2"], "waiting", log, asyncio.Event()))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    first_go.set()
    await first
    assert lock._keys == {} and lock._active == 0
    async with lock:  # the whole lock is free: no keyed hold is counted any more
        pass


def test_a_lock_shared_across_processes_is_always_whole(tmp_path: Path) -> None:
    shared, local = ClaimLock(tmp_path / "prepare.lock"), ClaimLock()
    assert shared.keyed(["GPU-0"]) is shared
    assert isinstance(local.keyed(["GPU-0"]), KeyedHold)
    assert local.keyed(None) is local
