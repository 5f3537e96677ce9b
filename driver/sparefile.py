"""The spare file of a directory of small files: recycled, and opened ahead.

Why a module: the CDI registry (``driver.cdi``) and the device metadata
files (``driver.claims.metadata_files``) each write a file per prepared
claim and remove it at the unprepare. Creating a file makes an inode and
removing one frees it; instead a removed file becomes the directory's spare
(:func:`driver.atomicfile.retire`) and the next file is written into the
spare and renamed to its name (:func:`driver.atomicfile.create_from_spare`).
:class:`Spare` owns that name (``.<stem>-<pid>-<random>``, a debris name
start-up removes) and can open it ahead of the write
(:meth:`Spare.open_ahead`): the preparer does so while a prepare waits for
the apiserver's answer, so the write after it starts with the file open.
The name is the process's own, not its pid's: the open ahead happens
outside the lock two plugin processes share in a rolling update, and their
pids may be equal (each pod in a PID namespace of its own). On a node
between calls every file-system call costs 3-5x what it does in a loop
(docs/figures.md), and a prepare writes two such files.

The descriptor opened ahead always refers to the file under the spare's
name: the write that uses it renames that file, and no other write or
removal in the directory goes on meanwhile (the lock). If the spare was
removed by hand since it was opened, the write starts over without it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from driver.atomicfile import StrPath, create_from_spare, own_pid, own_tag, retire

_OPEN = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC


class Spare:
    """The spare file named ``.<stem>-<pid>-<random>`` in ``directory``."""

    def __init__(self, directory: Path, stem: str, mode: int = 0o644) -> None:
        self._directory = os.fspath(directory)
        self._stem = stem
        self._mode = mode
        self._named: tuple[str, str] | None = None  # (own_tag, path): joined once
        self._ahead: tuple[int, int] | None = None  # (pid, descriptor) opened ahead
        self._lock = threading.Lock()  # a write's fill and rename against open_ahead

    @property
    def path(self) -> Path:
        return Path(self._name())

    def _name(self) -> str:
        """The spare's path, joined as a str once per process."""
        tag = own_tag()
        if self._named is None or self._named[0] != tag:
            self._named = (tag, f"{self._directory}/.{self._stem}-{tag}")
        return self._named[1]

    def open_ahead(self) -> None:
        """Open the spare (created if missing) for the next :meth:`create`;
        nothing if it is open already or a write is under way. An error is
        left to that write to meet."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._held() is None:
                self._ahead = (own_pid(), os.open(self._name(), _OPEN, self._mode))
        except OSError:
            pass
        finally:
            self._lock.release()

    def _held(self) -> int | None:
        """The descriptor opened ahead in this process (one a forked child
        inherited is closed: its spare is another name)."""
        if self._ahead is not None and self._ahead[0] != own_pid():
            os.close(self._ahead[1])
            self._ahead = None
        return None if self._ahead is None else self._ahead[1]

    def create(self, path: StrPath, data: bytes) -> None:
        """Create (or replace) ``path`` with ``data`` through the spare."""
        with self._lock:
            fd, self._ahead = self._held(), None
            try:
                create_from_spare(path, data, self._name(), self._mode, fd=fd)
            except FileNotFoundError:
                if fd is None:
                    raise
                # The spare was removed since it was opened: without it.
                create_from_spare(path, data, self._name(), self._mode)

    def retire(self, path: StrPath) -> bool:
        """Remove ``path`` (True if it existed), kept as the spare if there
        is none (``driver.atomicfile.retire``)."""
        with self._lock:
            return retire(path, self._name())
