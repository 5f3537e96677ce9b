"""The device directory a GPU prepare reads (driver/gpu/device_dir.py): nodes
are stat'ed once while the directory stays as it was, and read again once it
changes (a node made, a module loaded again), or while it may still change
unseen; the clocks are the test's, so nothing depends on the machine's speed."""

from __future__ import annotations

import os
from pathlib import Path

from driver.gpu.device_dir import RECHECK_NS, SETTLED_NS, DeviceDirectory


class Clocks:
    def __init__(self) -> None:
        self.mono = 0
        self.wall = 0

    def later(self, ns: int) -> None:
        self.mono += ns
        self.wall += ns


class Stats:
    """The directory's stat calls, by the name of what was stat'ed."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, path: str) -> os.stat_result:
        self.seen.append(Path(path).name)
        return Path(path).stat()


def directory(root: Path, clocks: Clocks, stats: Stats, *, settled: bool = True) -> DeviceDirectory:
    """``root`` as /dev, last changed long before the clocks' now."""
    if settled:
        clocks.wall = root.stat().st_mtime_ns + 10 * SETTLED_NS
    return DeviceDirectory(root, lambda: clocks.mono, lambda: clocks.wall, stats)


def test_nodes_are_read_once_while_the_directory_stays(tmp_path: Path) -> None:
    (tmp_path / "nvidiactl").write_text("")
    clocks, stats = Clocks(), Stats()
    dev = directory(tmp_path, clocks, stats)
    seen = stats.seen
    assert dev.stat("nvidiactl") is not None and dev.stat("nvidia-uvm") is None
    assert seen == [tmp_path.name, "nvidiactl", "nvidia-uvm"]
    seen.clear()
    assert dev.stat("nvidiactl") is not None and dev.stat("nvidia-uvm") is None
    assert seen == []  # one prepare's lookups share the directory's check
    clocks.later(RECHECK_NS)
    assert dev.stat("nvidiactl") is not None and dev.stat("nvidia-uvm") is None
    assert seen == [tmp_path.name]  # checked again: unchanged, nothing read again


def test_a_node_made_is_seen_once_the_directory_is_checked_again(tmp_path: Path) -> None:
    clocks, stats = Clocks(), Stats()
    dev = directory(tmp_path, clocks, stats)
    assert dev.stat("nvidia-uvm") is None
    (tmp_path / "nvidia-uvm").write_text("")  # the module loaded: the directory changed
    clocks.later(RECHECK_NS)
    clocks.wall = tmp_path.stat().st_mtime_ns  # just now
    seen = stats.seen
    seen.clear()
    assert dev.stat("nvidia-uvm") is not None
    # Changed just now: a second change within the file system clock's tick
    # would keep its mtime, so every lookup reads the node until it settles.
    assert dev.stat("nvidia-uvm") is not None
    assert seen.count("nvidia-uvm") == 2
    clocks.later(SETTLED_NS)
    seen.clear()
    assert dev.stat("nvidia-uvm") is not None and dev.stat("nvidia-uvm") is not None
    assert seen == [tmp_path.name, "nvidia-uvm"]


def test_a_missing_directory_holds_no_node_until_it_appears(tmp_path: Path) -> None:
    clocks, stats = Clocks(), Stats()
    dev = directory(tmp_path / "dev", clocks, stats, settled=False)
    seen = stats.seen
    assert dev.stat("nvidiactl") is None and dev.stat("nvidia-uvm") is None
    assert seen == ["dev"]  # the directory only
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    clocks.later(RECHECK_NS)
    assert dev.stat("nvidiactl") is not None
