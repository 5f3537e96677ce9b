"""The checkpoint's journal: one appended line per changed claim record.

Why it exists: the checkpoint file (``driver.checkpoint``) is one JSON
document of every prepared claim, so replacing it costs O(claims) per
prepare: at 1000 claims a save serialised and wrote 770 kB (2.4 ms, and a
scan of every record on top; docs/figures.md, "The checkpoint at 1000
claims"). The journal makes a prepare's write O(1): the store appends the
one record that changed (or its removal) as a line, and now and then
*compacts*, writing the whole checkpoint file (format 1, which every build
reads) and removing the journal. A reader replays the journal over the file.

The format: each entry is a newline followed by one JSON object,
``{"boot": <boot id>, "uid": <claim UID>, "record": <the ClaimRecord> | null}``
(null: the claim's record was removed). An entry carries the boot id it was
written under, so entries of an earlier boot are skipped like the file's
records are dropped. An entry is a full record, so replaying an entry twice
changes nothing: a crash between a compaction's file write and the
journal's removal leaves a journal the new file already holds, harmless.

Crash safety without fsync, as for the file (docs/design.md, "Failure
model"): an entry is one ``write`` on an ``O_APPEND`` descriptor; a process
killed in the middle of one (a write of many pages can stop at a page)
leaves a torn last line, which does not parse (a JSON object closes at its
end) and is skipped with a warning: the step it recorded never completed.
The newline *before* each entry keeps the next process's first entry off a
torn line. Where only this process writes the journal, an :class:`Appender`
holds it open, so an entry costs one ``write`` (a prepare's or unprepare's
only checkpoint syscall); where another plugin process may write it too (a
rolling update), :func:`append` opens it for each entry, as a compaction by
the other process removes it and the next append must create it anew.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SUFFIX = ".journal"


def journal_path(checkpoint: Path) -> Path:
    """The journal beside a checkpoint file: ``checkpoint.json.journal``."""
    return checkpoint.with_name(checkpoint.name + SUFFIX)


def entry(boot_id: str, uid: str, record_json: bytes | None) -> bytes:
    """One entry's bytes: the leading newline, then the JSON object."""
    head = b'\n{"boot":' + json.dumps(boot_id).encode() + b',"uid":' + json.dumps(uid).encode()
    return head + b',"record":' + (record_json if record_json is not None else b"null") + b"}"


def _open(path: Path) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:  # as driver.atomicfile does for the file
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o600)


def _write(fd: int, data: bytes, path: Path) -> None:
    written = os.write(fd, data)
    if written != len(data):  # a full disk: the rest would glue to a torn line
        raise OSError(f"short write to {path}: {written} of {len(data)} bytes")


def append(path: Path, data: bytes) -> os.stat_result:
    """Append ``data`` in one write (created if missing), opened for this
    entry only; the file's status after (another process may write it)."""
    fd = _open(path)
    try:
        _write(fd, data, path)
        return os.fstat(fd)
    finally:
        os.close(fd)


class Appender:
    """The journal of a process that alone writes it, held open between
    entries: :meth:`append` is one ``write``. :meth:`close` before the file is
    removed (a compaction), or the next entries would go to the removed file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def append(self, data: bytes) -> None:
        """Append ``data`` in one write (the file created if missing)."""
        if self._fd is None:
            self._fd = _open(self.path)
        try:
            _write(self._fd, data, self.path)
        except OSError:
            self.close()  # the next entry opens it anew
            raise

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def entries(raw: bytes, boot_id: str, path: Path) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(claim UID, record as parsed JSON or None for a removal) of every
    entry written under ``boot_id``, in order. A line that does not parse is
    a torn write (skipped, with a warning); one that parses but is not an
    entry is reported and skipped."""
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            log.warning("%s line %d: a torn write (a crash in the middle of it); skipped",
                        path, number)  # fmt: skip
            continue
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("uid"), str)
            or not isinstance(item.get("record"), dict | None)
        ):
            log.error("%s line %d: not a journal entry; skipped: %.200r", path, number, line)
            continue
        if item.get("boot") != boot_id:
            continue
        yield item["uid"], item["record"]
