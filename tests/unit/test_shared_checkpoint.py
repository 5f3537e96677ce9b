"""Two plugin processes of a rolling update share one checkpoint and one lock.

Each "process" here is what ``plugin.app`` builds: one checkpoint store,
dynamic MIG over it (``driver.mig.discovery.mig_support``), the real GPU
and MIG handlers over its own NVML fake of one machine, and a claim
preparer whose lock takes the shared lock file. The MIG guard must follow
what the other process records; the preparer alone must wait for the other
process's lock; the process reads its checkpoint once at start.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

from driver.cdi import CdiRegistry
from driver.checkpoint import (
    ADMIN_ACCESS,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
)
from driver.claims.lock import ClaimLock
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.gpu.kind import GpuType
from driver.mig.discovery import mig_support
from driver.mig.startup import ownership
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from tests.claims_doubles import NODE, Reader
from tests.signals import waiting_in_flock

BOOT = "boot"
UUID = "GPU-0000"
FULL, MIG = "gpu-0", "gpu-0-mig-3g-40gb-4"


class CountingStore(CheckpointStore):
    def __init__(self, path: Path, boot_id: str) -> None:
        super().__init__(path, boot_id)
        self.loads = 0

    def load(self) -> Checkpoint:
        self.loads += 1
        return super().load()


class Process:
    """One plugin pod: its store, MIG support, handlers and preparer."""

    def __init__(self, directory: Path, machine: FakeMachine, reader: Reader) -> None:
        self.store = CountingStore(directory / "checkpoint.json", BOOT)
        backend = FakeNvml(machine)
        nowhere = directory / "nonexistent"
        support = mig_support(
            backend, "all", "", True, False,
            dev_root=nowhere, checkpoint=self.store, shared_checkpoint=True,
        )  # fmt: skip
        gpus = GpuType(backend, nowhere, nowhere, mig=support)
        inventory = NodeInventory()
        inventory.replace_pool(NODE, gpus.discover().devices)  # the first scan
        self.preparer = ClaimPreparer(
            reader,
            inventory,
            gpus.handlers(),
            self.store,
            CdiRegistry(directory / "cdi"),
            lock=ClaimLock(directory / "prepare.lock"),
        )


def node(tmp_path: Path) -> tuple[FakeMachine, Reader, Process, Process]:
    machine = FakeMachine()
    for i in range(2):
        machine.add_gpu(f"GPU-{i:04d}", "H100-SXM5-80GB", f"0000:{0x10 + i:02x}:00.0")
    reader = Reader()
    return machine, reader, Process(tmp_path, machine, reader), Process(tmp_path, machine, reader)


async def test_mig_guard_follows_what_the_other_process_prepared(tmp_path: Path) -> None:
    machine, reader, old, new = node(tmp_path)
    whole, part = reader.add("whole", [FULL]), reader.add("part", [MIG])
    assert (await old.preparer.prepare([whole]))[whole.uid].error == ""
    # The new pod's guard was seeded before the old pod took the GPU whole:
    # it must learn of it from the checkpoint, not create an instance on it.
    error = (await new.preparer.prepare([part]))[part.uid].error
    assert "held whole by a claim" in error, error
    assert machine.gpus[UUID].instances == {} and not machine.gpus[UUID].mig_current
    # ... and of its release: then the partition is made.
    assert (await old.preparer.unprepare([whole]))[whole.uid] == ""
    assert (await new.preparer.prepare([part]))[part.uid].error == ""
    assert len(machine.gpus[UUID].instances) == 1
    # The old pod's guard follows the new pod's partition the other way round.
    error = (await old.preparer.prepare([whole]))[whole.uid].error
    assert "MIG" in error, error


async def test_a_process_reads_its_checkpoint_once_at_start(tmp_path: Path) -> None:
    """Discovery (MIG ownership) and the preparer share the process's one store."""
    _machine, _reader, old, _new = node(tmp_path)
    assert old.store.loads == 1


def test_an_admin_access_view_holds_no_gpu_whole() -> None:
    """The typed records say an admin-access view holds nothing, for the
    planner and the MIG guard alike."""
    view = DeviceRecord(
        request_names=["r"], pool_name=NODE, device_name=FULL, kind="gpu", local_id=UUID,
        undo={ADMIN_ACCESS: True},
    )  # fmt: skip
    uid = "0b9d5a1e-6c3f-4a2b-8e7d-1f0a9c8b7d60"
    record = ClaimRecord(
        uid=uid, namespace="ns", name="v", state=ClaimState.PREPARE_COMPLETED, devices=[view]
    )
    assert ownership(Checkpoint(boot_id=BOOT, claims={uid: record})).full_gpus == frozenset()


async def test_the_preparer_alone_waits_for_the_other_process_lock(tmp_path: Path) -> None:
    """The one claim lock: a prepare through the preparer (no gRPC servicer
    around it) waits while another process holds the shared lock file."""
    _machine, reader, old, _new = node(tmp_path)
    path = tmp_path / "prepare.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the other plugin pod is preparing
        whole = reader.add("whole", [FULL])
        task = asyncio.create_task(old.preparer.prepare([whole]))
        await waiting_in_flock(path)
        assert not task.done() and whole.uid not in old.preparer.checkpoint.claims
        fcntl.flock(fd, fcntl.LOCK_UN)
        async with asyncio.timeout(5):
            assert (await task)[whole.uid].error == ""
    finally:
        os.close(fd)
