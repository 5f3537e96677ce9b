"""The host's device directory, as a GPU prepare reads it: nodes by name, stat'ed once per change.

Why a module: every full-GPU prepare names four device nodes in its CDI
spec (the GPU's ``nvidiaN`` and the control nodes ``nvidiactl``,
``nvidia-uvm``, ``nvidia-uvm-tools``), each with the major and minor the
host gave it (``nvidia-uvm``'s major is dynamic: it changes when the
module is loaded again). Stat'ing the four on every prepare cost 4 of a
pair's 36 system calls, paid after the plugin idled (docs/figures.md).
A node made or removed changes the directory's mtime, so what was read is
kept while the directory's (device, inode, mtime) stays as it was, and the
directory itself is stat'ed at most once per :data:`RECHECK_NS` (the
lookups of one prepare share one). Two guards:

- a directory changed less than :data:`SETTLED_NS` ago may change again
  within the same tick of the file system's coarse clock and keep its
  mtime, so nothing read from it then is kept;
- a directory that does not exist holds no node: that is kept too, until
  the directory appears.

A change is seen within :data:`RECHECK_NS`: a node that changes while a
claim is prepared was always a race with the container's start.

Concurrency: prepares of claims on different GPUs run in worker threads
side by side; the state is one tuple, replaced whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

RECHECK_NS = 10_000_000  # the directory is stat'ed again after this long (10 ms)
SETTLED_NS = 1_000_000_000  # changed less than this long ago: nothing read is kept
_MISSING = (-1, -1, -1)  # the stamp of a directory that does not exist

Stamp = tuple[int, int, int]


class DeviceDirectory:
    """Device nodes under ``root`` by name (``os.stat_result``, or None)."""

    def __init__(
        self,
        root: Path,
        clock: Callable[[], int] = time.monotonic_ns,
        wall: Callable[[], int] = time.time_ns,
        stat: Callable[[str], os.stat_result] = os.stat,
    ) -> None:
        self._root = os.fspath(root)
        self._paths: dict[str, str] = {}  # name -> its path, joined once
        self._clock = clock  # when the directory was last stat'ed
        self._wall = wall  # against its mtime (the file system's clock)
        self._stat = stat
        # (checked at, stamp or None when nothing may be kept, {name: stat})
        self._state: tuple[int, Stamp | None, dict[str, os.stat_result | None]] | None = None

    def path(self, name: str) -> str:
        """The node's path on the host (a few names, each joined once)."""
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = f"{self._root}/{name}"
        return path

    def stat(self, name: str) -> os.stat_result | None:
        """The node ``name`` as the directory holds it now (None: not there)."""
        state = self._state
        now = self._clock()
        if state is None or now - state[0] >= RECHECK_NS:
            stamp = self._stamp()
            kept = state[2] if state is not None and stamp is not None and stamp == state[1] else {}
            state = self._state = (now, stamp, kept)
        _, stamp, known = state
        if stamp is not None and name in known:
            return known[name]
        if stamp == _MISSING:
            found = None
        else:
            try:
                found = self._stat(self.path(name))
            except OSError:
                found = None
        if stamp is not None:
            known[name] = found
        return found

    def _stamp(self) -> Stamp | None:
        """(device, inode, mtime) of the directory; :data:`_MISSING` when it
        does not exist; None when what is read from it may not be kept."""
        try:
            st = self._stat(self._root)
        except FileNotFoundError:
            return _MISSING
        except OSError:
            return None
        if self._wall() - st.st_mtime_ns < SETTLED_NS:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns)
