"""Crash-safe file replacement: write a temp file, fsync, rename, fsync dir.

After a crash at any point the target holds either its old content or the
new content, never a mix; a leftover temp file is the only possible debris
and is named so it is recognisably ours (``.<name>.tmp-<pid>``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(directory)


def remove_durably(path: Path) -> bool:
    """Remove ``path`` if present and persist the removal; True if it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(directory: Path) -> int:
    """Remove temp files left by a crash in the middle of :func:`write_atomic`."""
    count = 0
    if directory.is_dir():
        for leftover in directory.glob(".*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                count += 1
    return count
