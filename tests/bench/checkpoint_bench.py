"""Checkpoint cost against the number of claims prepared on one node.

Why it exists: the checkpoint file is the record of every prepared claim,
so writing it whole costs more the more claims the node holds. A prepare
appends the one record that changed to the checkpoint's journal instead
(``driver.journal``) and the whole file is written only at a compaction
(``driver.checkpoint``). This measures, at 10, 100 and 1000 prepared
claims: the time of one compaction (a whole-file save: median, p99), the
file's size, and the median and p99 of one more claim's prepare through the
real preparer (``driver.claims.preparer``) with the real GPU handler over
the in-memory NVML fake (``driver.nvml.fake``), each followed by its
unprepare (untimed). Figures only: nothing here asserts a timing.

The node is the fake with one GPU per claim plus one (a GPU is the device
whose record is typical: one device, its CDI device ids, its spec).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.gpu.kind import GpuType
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from tests.claims_doubles import NODE, Reader

BOOT_ID = "bench-boot"


def p99(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def node(directory: Path, gpus: int) -> tuple[Reader, ClaimPreparer, CheckpointStore, list[str]]:
    """A node with ``gpus`` fake GPUs: its claims, preparer, store and device names."""
    machine = FakeMachine()
    for i in range(gpus):
        bus, dev = divmod(i, 32)
        machine.add_gpu(f"GPU-{i:08d}", "H100-SXM5-80GB", f"0000:{bus + 1:02x}:{dev:02x}.0")
    gpu = GpuType(FakeNvml(machine), directory / "sys", directory / "dev")
    inventory = NodeInventory()
    inventory.replace_pool(NODE, gpu.discover().devices)
    store = CheckpointStore(directory / "checkpoint.json", BOOT_ID)
    reader = Reader()
    cdi = CdiRegistry(directory / "cdi")
    names = [d.name for d in inventory.devices(NODE)]
    return reader, ClaimPreparer(reader, inventory, gpu.handlers(), store, cdi), store, names


async def measure(claims: int, saves: int, prepares: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="patchbay-cpbench-") as tmp:
        reader, preparer, store, names = node(Path(tmp), claims + 1)
        held = [reader.add(f"held-{i}", [names[i]]) for i in range(claims)]
        for i in range(0, claims, 50):  # batches of 50, as a busy kubelet sends
            await preparer.prepare(held[i : i + 50])
        checkpoint = preparer.checkpoint
        save_s = []
        for _ in range(saves):
            started = time.perf_counter()
            store.save(checkpoint)
            save_s.append(time.perf_counter() - started)
        size = store.path.stat().st_size
        prepare_s = []
        for i in range(prepares):
            ref = reader.add(f"extra-{i}", [names[claims]])
            started = time.perf_counter()
            result = (await preparer.prepare([ref]))[ref.uid]
            prepare_s.append(time.perf_counter() - started)
            assert not result.error, result.error
            await preparer.unprepare([ref])
        return {
            "save_median_ms": statistics.median(save_s) * 1e3,
            "save_p99_ms": p99(save_s) * 1e3,
            "bytes": float(size),
            "prepare_median_ms": statistics.median(prepare_s) * 1e3,
            "prepare_p99_ms": p99(prepare_s) * 1e3,
        }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="checkpoint_bench")
    parser.add_argument("--claims", default="10,100,1000", help="prepared claims per run")
    parser.add_argument("--saves", type=int, default=200, help="timed saves per run")
    parser.add_argument("--prepares", type=int, default=200, help="timed prepares per run")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse(argv)
    # The fake GPUs have no sysfs tree: the scan's "no PCIe root" warnings are expected.
    logging.getLogger("driver.gpu").setLevel(logging.ERROR)
    print(
        f"{'claims':>7} {'compact med ms':>15} {'compact p99':>12} {'bytes':>10} "
        f"{'bytes/claim':>12} {'prepare median ms':>18} {'prepare p99 ms':>15}"
    )
    for claims in (int(c) for c in args.claims.split(",")):
        f = asyncio.run(measure(claims, args.saves, args.prepares))
        print(
            f"{claims:>7} {f['save_median_ms']:>15.3f} {f['save_p99_ms']:>12.3f} "
            f"{int(f['bytes']):>10} {f['bytes'] / max(claims, 1):>12.0f} "
            f"{f['prepare_median_ms']:>18.3f} {f['prepare_p99_ms']:>15.3f}",
            flush=True,
        )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
