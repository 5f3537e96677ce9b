"""Which prepares may overlap (issue 36), as scenarios any NVML world runs:
the fake in ``tests/unit/test_prepare_overlap.py``, pynvml over the C mock
in ``tests/contract/test_prepare_overlap_mock.py`` (through
``tests.contract.overlap_runner``).

Each runs the real preparer, its per-device lock (``driver.claims.lock``,
``driver.claims.keys``) and the real GPU and MIG handlers, with several
kubelet calls in flight at once: each device handler's prepare and unprepare
is recorded as it enters and leaves (in the worker thread MIG work runs in),
and the first to enter waits until every other call has either queued on
the claim lock or entered a handler itself, so two that could overlap do.
With the one claim lock of before (every claim taking the lock whole), the
different GPUs' claims take turns and the first scenario fails ("claims on
two GPUs took turns"), it does not hang; with the key locks made no-ops,
two handlers run on GPU-0000 at once.

Why a module: the scenarios are one text for both worlds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.lock import ClaimLock
from driver.claims.preparer import ClaimPreparer
from driver.devices.handler import DeviceHandler
from driver.devices.inventory import NodeInventory
from tests.claims_doubles import NODE, Reader
from tests.unit.mig_node import Node

Instances = Callable[[str], int]  # MIG instances a GPU (UUID) has now, in the world's terms


GATE_S = 30.0  # bounds a broken test only: the gate opens on a signal


class Calls:
    """Every call in flight: waiting on the claim lock, inside a device handler,
    or done; and the handlers' enter/leave events in order."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.waiting = 0  # calls queued on the claim lock
        self.inside = 0  # handler calls running
        self.done = 0  # calls that left their handler
        self.changed = threading.Condition()
        self.events: list[tuple[str, str]] = []  # ("enter" | "leave", GPU UUID)

    def bump(self, field: str, by: int) -> None:
        with self.changed:
            setattr(self, field, getattr(self, field) + by)
            self.changed.notify_all()

    def enter(self, gpu: str) -> None:
        with self.changed:
            self.events.append(("enter", gpu))
            self.inside += 1
            self.changed.notify_all()
            # Until every other call is queued on the lock or inside a handler.
            others_placed = self.changed.wait_for(
                lambda: self.waiting + self.inside + self.done >= self.total, GATE_S
            )
        assert others_placed, "calls neither queued on the lock nor entered a handler"

    def leave(self, gpu: str) -> None:
        with self.changed:
            self.events.append(("leave", gpu))
            self.inside -= 1
            self.done += 1
            self.changed.notify_all()


class WatchedLock(ClaimLock):
    """The claim lock, counting the calls queued on it, whole or on keys."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Calls | None = None

    async def _waiting(self, wait: Awaitable[Any]) -> Any:
        if self.calls is not None:
            self.calls.bump("waiting", 1)
        try:
            return await wait
        finally:
            if self.calls is not None:
                self.calls.bump("waiting", -1)

    async def __aenter__(self) -> ClaimLock:
        entered: ClaimLock = await self._waiting(super().__aenter__())
        return entered

    async def _enter_keys(self, keys: list[str]) -> None:
        await self._waiting(super()._enter_keys(keys))


class Recorded:
    """A device handler whose prepare and unprepare record their GPU."""

    def __init__(self, handler: DeviceHandler, lock: WatchedLock) -> None:
        self._handler = handler
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)

    def _around(self, local_id: str, call: Callable[[], Any]) -> Any:
        gpu = local_id.split(":")[0]  # a MIG placement's local id starts with its GPU's
        calls = self._lock.calls
        assert calls is not None
        calls.enter(gpu)
        try:
            return call()
        finally:
            calls.leave(gpu)

    def prepare(self, device: Any, *args: Any, **kwargs: Any) -> Any:
        return self._around(device.local_id, lambda: self._handler.prepare(device, *args, **kwargs))

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        self._around(local_id, lambda: self._handler.unprepare(kind, local_id, undo))


def overlaps(events: list[tuple[str, str]], key: Callable[[str], str]) -> list[str]:
    """The keys (of GPUs) with a handler entered while another was inside."""
    inside: dict[str, int] = {}
    found = []
    for what, gpu in events:
        k = key(gpu)
        if what == "enter":
            if inside.get(k):
                found.append(k)
            inside[k] = inside.get(k, 0) + 1
        else:
            inside[k] -= 1
    return found


def preparer_on(tmp_path: Path, node: Node) -> tuple[ClaimPreparer, WatchedLock, Reader]:
    logging.getLogger("driver").setLevel(logging.ERROR)  # the fake's hosts have no sysfs
    inventory = NodeInventory()
    inventory.replace_pool(NODE, list(node.devices.values()))
    lock = WatchedLock()
    handlers = {k: Recorded(h, lock) for k, h in node.handlers.items()}
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    reader = Reader()
    cdi = CdiRegistry(tmp_path / "cdi")
    return ClaimPreparer(reader, inventory, handlers, store, cdi, lock=lock), lock, reader


async def in_flight(
    lock: WatchedLock, calls: list[Awaitable[Mapping[str, Any]]]
) -> tuple[list[Mapping[str, Any]], list[tuple[str, str]]]:
    """The calls' results, all in flight at once, and the handlers' events."""
    lock.calls = Calls(len(calls))
    results = await asyncio.gather(*calls)
    return results, lock.calls.events


async def different_gpus_overlap(tmp_path: Path, node: Node, instances: Instances) -> None:
    """MIG claims on two GPUs overlap, never on one GPU, prepare and unprepare."""
    preparer, lock, reader = preparer_on(tmp_path, node)
    # Three MIG placements on GPU 0 and two on GPU 1, a claim each.
    names = [f"gpu-0-mig-1g-10gb-{s}" for s in (0, 1, 2)]
    names += [f"gpu-1-mig-1g-10gb-{s}" for s in (0, 1)]
    refs = [reader.add(f"c{i}", [name]) for i, name in enumerate(names)]

    results, prepared = await in_flight(lock, [preparer.prepare([ref]) for ref in refs])
    assert [r[ref.uid].error for r, ref in zip(results, refs, strict=True)] == [""] * len(refs)
    assert instances("GPU-0000") == 3 and instances("GPU-0001") == 2
    undone, unprepared = await in_flight(lock, [preparer.unprepare([ref]) for ref in refs])
    assert [u[ref.uid] for u, ref in zip(undone, refs, strict=True)] == [""] * len(refs)

    for events in (prepared, unprepared):
        assert (
            sorted(g for what, g in events if what == "enter")
            == ["GPU-0000"] * 3 + ["GPU-0001"] * 2
        )
        assert overlaps(events, lambda gpu: gpu) == [], "two handlers ran on one GPU at once"
        # The per-device lock: a claim on the other GPU entered its handler
        # while one on the first was inside.
        assert overlaps(events, lambda gpu: "node") != [], "claims on two GPUs took turns"
    assert instances("GPU-0000") == 0 and instances("GPU-0001") == 0
    assert preparer.checkpoint.claims == {}


async def whole_and_mig_take_turns(tmp_path: Path, node: Node, instances: Instances) -> None:
    """A whole GPU and a MIG placement on it never overlap; exactly one gets
    the GPU: the second plans against the first's holding."""
    preparer, lock, reader = preparer_on(tmp_path, node)
    whole = reader.add("whole", ["gpu-0"])
    mig = reader.add("mig", ["gpu-0-mig-3g-40gb-4"])

    results, events = await in_flight(lock, [preparer.prepare([whole]), preparer.prepare([mig])])
    errors = [r[ref.uid].error for r, ref in zip(results, [whole, mig], strict=True)]
    assert overlaps(events, lambda gpu: gpu) == [], "the whole GPU and its MIG ran at once"
    assert sorted(e == "" for e in errors) == [False, True], errors
    failed = next(e for e in errors if e)
    assert "GPU-0000" in failed and ("MIG" in failed), failed
    kept = whole if errors[0] == "" else mig
    assert list(preparer.checkpoint.claims) == [kept.uid]
    assert (instances("GPU-0000") > 0) == (kept is mig)
    await in_flight(lock, [preparer.unprepare([kept])])
    assert instances("GPU-0000") == 0 and preparer.checkpoint.claims == {}


SCENARIOS = {f.__name__: f for f in (different_gpus_overlap, whole_and_mig_take_turns)}
