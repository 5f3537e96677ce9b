"""Wait for a file (or any file in some directories) to be written, without polling.

Why this module exists: the simulated hot-plug feed is a file that a
simulated host appends to. Reading it every 20 ms cost an idle plugin
0.7 % of a core (50 wake-ups a second, an open, a seek and a read each);
inotify wakes the reader only when the file changes, so an idle plugin
sleeps. The watch is on the file's directory, so a feed that does not exist
yet (or is replaced) is seen when it appears. Where inotify is not available
(not Linux, or the per-user watch limit reached) :meth:`FileWatch.wait`
sleeps ``fallback_s`` instead, and the caller reads on every wake-up as before.

:class:`DirWatch` is the same wait over a set of directories that grows
(the simulated host's sysfs effects: a write to any driver's ``bind``, to
``drivers_probe`` or to a PF's ``sriov_numvfs`` wakes it), and another
thread can wake it to stop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import time
from pathlib import Path

log = logging.getLogger(__name__)

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_Q_OVERFLOW = 0x4000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000
MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


class FileWatch:
    """Blocks until ``path`` may have changed (or a timeout passes)."""

    def __init__(self, path: Path, fallback_s: float = 0.02) -> None:
        self.path = path
        self.fallback_s = fallback_s
        self.fd = -1
        libc = _libc()
        if libc is None or not hasattr(libc, "inotify_init1"):
            log.info("no inotify: the feed %s is read every %.2fs", path, fallback_s)
            return
        fd = libc.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        if fd < 0:
            self._fallback("inotify_init1", ctypes.get_errno())
            return
        if libc.inotify_add_watch(fd, str(path.parent).encode(), MASK) < 0:
            self._fallback(f"inotify_add_watch {path.parent}", ctypes.get_errno())
            os.close(fd)
            return
        self.fd = fd

    def _fallback(self, what: str, errno: int) -> None:
        log.warning("%s failed (%s): the feed %s is read every %.2fs",
                    what, os.strerror(errno), self.path, self.fallback_s)  # fmt: skip

    @property
    def event_driven(self) -> bool:
        return self.fd >= 0

    def wait(self, timeout: float) -> bool:
        """Whether ``path`` may have changed; False when ``timeout`` passed first."""
        if self.fd < 0:
            time.sleep(min(timeout, self.fallback_s))
            return True
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            readable, _, _ = select.select([self.fd], [], [], remaining)
            if readable and self._ours(os.read(self.fd, 65536)):
                return True

    def _ours(self, data: bytes) -> bool:
        """Whether the events read name our file (or the queue overflowed)."""
        offset, name = 0, self.path.name.encode()
        while offset + _HEADER.size <= len(data):
            _, mask, _, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            if mask & IN_Q_OVERFLOW or data[offset : offset + length].rstrip(b"\0") == name:
                return True
            offset += length
        return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class DirWatch:
    """Blocks until a file in one of the watched directories changes, a
    timeout passes, or :meth:`wake` is called."""

    def __init__(self, fallback_s: float = 0.02) -> None:
        self.fallback_s = fallback_s
        self._watched: set[Path] = set()
        self._wake_r, self._wake_w = os.pipe()
        self._libc = _libc()
        self.fd = -1
        if self._libc is not None and hasattr(self._libc, "inotify_init1"):
            self.fd = self._libc.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        if self.fd < 0:
            log.info("no inotify: directories are checked every %.2fs", fallback_s)

    @property
    def event_driven(self) -> bool:
        return self.fd >= 0

    def add(self, directory: Path) -> None:
        """Watch ``directory`` too (again: nothing changes)."""
        if self.fd < 0 or directory in self._watched or self._libc is None:
            return
        if self._libc.inotify_add_watch(self.fd, str(directory).encode(), MASK) < 0:
            errno = ctypes.get_errno()
            log.warning("inotify_add_watch %s failed (%s): checked every %.2fs from now",
                        directory, os.strerror(errno), self.fallback_s)  # fmt: skip
            os.close(self.fd)
            self.fd = -1
            return
        self._watched.add(directory)

    def wait(self, timeout: float) -> bool:
        """Whether something may have changed (or a wake came); False when
        ``timeout`` passed first. Without inotify: True after ``fallback_s``."""
        fds = [self._wake_r] + ([self.fd] if self.fd >= 0 else [])
        limit = timeout if self.fd >= 0 else min(timeout, self.fallback_s)
        readable, _, _ = select.select(fds, [], [], max(0.0, limit))
        for fd in readable:
            os.read(fd, 65536)  # drained: the caller looks at everything anyway
        return bool(readable) or self.fd < 0

    def wake(self) -> None:
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        for fd in (self.fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self.fd = self._wake_r = self._wake_w = -1
