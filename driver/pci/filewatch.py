"""Wait for a file to be written, without polling (Linux inotify).

Why this module exists: the simulated hot-plug feed is a file that a
simulated host appends to. Reading it every 20 ms cost an idle plugin
0.7 % of a core (50 wake-ups a second, an open, a seek and a read each);
inotify wakes the reader only when the file changes, so an idle plugin
sleeps. The watch is on the file's directory, so a feed that does not exist
yet (or is replaced) is seen when it appears. Where inotify is not available
(not Linux, or the per-user watch limit reached) :meth:`FileWatch.wait`
sleeps ``fallback_s`` instead, and the caller reads on every wake-up as before.
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
