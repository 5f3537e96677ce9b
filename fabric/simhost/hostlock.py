"""One lock per simulated host, across threads and processes.

Why this module exists: three parties change one simulated host's tree.
The fabric service hot-adds and hot-removes devices (its own process), the
sysfs effects step applies the driver's writes (a thread of the test process
or of ``python -m fabric.simhost effects``), and tests hot-remove adapters by
hand. A kernel serialises such changes; a plain directory does not, and
without a lock an effects pass once removed a NIC's VFs while the fabric
process was still reading them in ``hot_add``. Every change to the tree, the
NVML state or ``host.json`` happens under this lock.

The lock is an ``flock`` on ``host.lock`` in the host's directory (another
process) under a re-entrant thread lock kept per path (another thread, or a
second :class:`SimHost` of the same directory in this process). Only the
outermost acquire of a thread takes the file lock, and ``on_acquire`` runs
there: the host re-reads what another process may have changed meanwhile.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

LOCK_FILE = "host.lock"

_registry_lock = threading.Lock()
_thread_locks: dict[str, tuple[threading.RLock, threading.local]] = {}


def _locks_of(path: Path) -> tuple[threading.RLock, threading.local]:
    key = os.path.realpath(path)
    with _registry_lock:
        if key not in _thread_locks:
            _thread_locks[key] = (threading.RLock(), threading.local())
        return _thread_locks[key]


class HostLock:
    """Context manager: the host's lock, re-entrant within a thread."""

    def __init__(self, directory: Path, on_acquire: Callable[[], None] | None = None) -> None:
        self.path = directory / LOCK_FILE
        self._on_acquire = on_acquire
        self._rlock, self._state = _locks_of(self.path)

    def __enter__(self) -> HostLock:
        self._rlock.acquire()
        depth = getattr(self._state, "depth", 0)
        if depth == 0:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                self._rlock.release()
                raise
            self._state.fd = fd
        self._state.depth = depth + 1
        if depth == 0 and self._on_acquire is not None:
            try:
                self._on_acquire()
            except BaseException:
                self.__exit__(None, None, None)
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state.depth -= 1
        if self._state.depth == 0:
            fd = self._state.fd
            self._state.fd = -1
            os.close(fd)  # closing the descriptor releases the flock
        self._rlock.release()

    @property
    def held(self) -> bool:
        """Whether this thread holds the lock now."""
        return getattr(self._state, "depth", 0) > 0
