"""The hot-plug feed's reader is woken by inotify, not by a timer
(``driver.pci.filewatch``, ``driver.pci.uevents.UeventFeed.poll``)."""

from __future__ import annotations

import select
import threading
from pathlib import Path

from driver.pci.filewatch import DirWatch, FileWatch
from driver.pci.uevents import UeventFeed, encode


def queued(watch: FileWatch) -> bool:
    """Whether inotify has an event waiting for the watch (no waiting here)."""
    return bool(select.select([watch.fd], [], [], 0)[0])


def test_a_write_to_the_file_is_an_inotify_event(tmp_path: Path) -> None:
    feed = tmp_path / "uevents.jsonl"
    watch = FileWatch(feed)
    assert watch.event_driven, "inotify on Linux"
    assert not queued(watch)
    with feed.open("a") as out:
        out.write("x\n")
    assert queued(watch)
    assert watch.wait(30.0) is True
    watch.close()


def test_other_files_in_the_directory_do_not_wake_the_reader(tmp_path: Path) -> None:
    watch = FileWatch(tmp_path / "uevents.jsonl")
    (tmp_path / "state.json").write_text("{}")
    assert queued(watch)  # the directory's event is there before the wait...
    assert watch.wait(0.05) is False  # ...and is not taken for the feed's
    assert not queued(watch)
    watch.close()


def test_poll_returns_the_event_written_while_it_waits(tmp_path: Path) -> None:
    path = tmp_path / "uevents.jsonl"
    path.write_text("")
    feed = UeventFeed(path)
    feed.read_new()
    got: list[int] = []
    waiting = threading.Event()

    def reader() -> None:
        waiting.set()
        got.extend(e.sequence_number for e in feed.poll(60.0))

    thread = threading.Thread(target=reader)
    thread.start()
    waiting.wait()
    with path.open("a") as out:
        out.write(encode({"ACTION": "add", "SEQNUM": "7"}) + "\n")
    thread.join(60)
    assert got == [7]
    assert feed._watch is not None and feed._watch.event_driven


def test_a_dir_watch_wakes_for_any_file_in_its_directories_and_for_wake(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    watch = DirWatch()
    assert watch.event_driven, "inotify on Linux"
    watch.add(first)
    assert watch.wait(0) is False  # nothing yet
    (second / "bind").write_text("x")  # not watched yet
    assert watch.wait(0) is False
    watch.add(second)
    watch.add(second)  # again: one watch
    (second / "bind").write_text("y")
    assert watch.wait(30.0) is True
    assert watch.wait(0) is False  # the events were drained
    watch.wake()
    assert watch.wait(30.0) is True
    watch.close()
