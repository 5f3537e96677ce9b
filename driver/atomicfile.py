"""Atomic file replacement: write a temp file, rename it over the target.

After a crash of the process at any point the target holds either its old
content or the new content, never a mix: the rename is atomic and what was
written before it is in the kernel's page cache, which outlives the process.
Nothing here calls ``fsync``: only power loss or a kernel crash loses
unsynced data, both mean a reboot, and everything patchbay writes describes
state a reboot undoes anyway (docs/design.md, "Failure model"). A leftover
temp file is the only possible debris and is named so it is recognisably
ours (``.<name>.tmp-<pid>``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically (not synced to disk)."""
    directory = path.parent
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)
    try:
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def remove_file(path: Path) -> bool:
    """Remove ``path`` if present; True if it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def remove_stale_temps(directory: Path) -> int:
    """Remove temp files left by a crash in the middle of :func:`write_atomic`."""
    count = 0
    if directory.is_dir():
        for leftover in directory.glob(".*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                count += 1
    return count
