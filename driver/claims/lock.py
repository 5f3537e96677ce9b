"""The locks of prepare and unprepare: per device within this process, one
across processes.

Claims that touch different devices are prepared at once; claims that share
a device, or a GPU (its MIG placements, its shares and the GPU whole), take
turns. :class:`ClaimLock` gives both modes:

- ``async with lock.keyed(keys):`` holds the claim's keys (``driver.claims.keys``:
  one per physical device, and the claim's own), taken in sorted order so
  two claims never wait on each other in a circle. Keyed holders run side by
  side when their keys differ.
- ``async with lock:`` is exclusive: it waits until no keyed holder is left
  and keeps new ones out (start-up recovery, compaction, a GPU reset, a
  claim whose devices are not all known).

During a rolling update (kubelet 1.33+) two plugin pods of patchbay run on
one node at once, each with its own sockets, and the kubelet may call
either. When a lock file is configured, every holder takes the exclusive
mode and an exclusive ``fcntl.flock`` on that file in the plugin directory,
which both pods share through the host path: the checkpoint they share is
re-read under it. The window is short, so per-device locking across two
processes is not worth per-key lock files. The claim preparer
(``driver.claims.preparer``) owns the lock; what keyed holders share in
memory and on disk (the checkpoint, the CDI registry's spare file) it
guards with a short lock of its own.

Concurrency model: callers queue on the event loop (asyncio locks), never on
threads; the blocking ``flock`` call runs in a worker thread via
``asyncio.to_thread``; if the waiting task is cancelled, the lock the thread
still obtains is released as soon as it is. ``flock`` locks belong to the
open file description and vanish when the process dies, so a crashed pod
never leaves the other one stuck.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


def _lock_fd(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX)


def _close_after(fut: asyncio.Future[None], fd: int) -> None:
    """Done-callback for a lock attempt whose waiter was cancelled."""
    if not fut.cancelled() and fut.exception() is None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


class ClaimLock:
    """``async with lock:`` runs the body alone; ``async with lock.keyed(keys):``
    alongside holders of other keys. With ``path=None`` only this process is
    serialised (no rolling update)."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._local = asyncio.Lock()  # the exclusive mode; keyed entries pass through it
        self._fd: int | None = None
        self._keys: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> (lock, its users)
        self._active = 0  # keyed holders inside, or waiting on a key
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def shared(self) -> bool:
        """Whether another process takes this lock too (a rolling update): then
        the state it guards (the checkpoint) may change while it is not held."""
        return self._path is not None

    def keyed(self, keys: Collection[str] | None) -> KeyedHold | ClaimLock:
        """The hold for a claim with these device keys: exclusive when the keys
        are not known (``None``) or the lock is shared across processes."""
        if keys is None or self.shared:
            return self
        return KeyedHold(self, sorted(set(keys)))

    async def __aenter__(self) -> ClaimLock:
        await self._local.acquire()
        try:
            await self._idle.wait()  # no keyed holder may enter while we wait
            if self._path is not None:
                self._fd = await self._acquire_file(self._path)
        except BaseException:
            self._local.release()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
        finally:
            self._fd = None
            self._local.release()

    # -- keyed holds (KeyedHold) ------------------------------------------

    async def _enter_keys(self, keys: list[str]) -> None:
        async with self._local:  # waits out an exclusive holder, briefly
            self._active += 1
            self._idle.clear()
        taken: list[str] = []
        try:
            for key in keys:
                lock, users = self._keys.get(key) or (asyncio.Lock(), 0)
                self._keys[key] = (lock, users + 1)
                taken.append(key)
                await lock.acquire()
        except BaseException:
            self._leave_keys(taken, held=taken[:-1])
            raise

    def _leave_keys(self, keys: list[str], held: list[str] | None = None) -> None:
        for key in keys:
            lock, users = self._keys[key]
            if held is None or key in held:
                lock.release()
            if users > 1:
                self._keys[key] = (lock, users - 1)
            else:
                del self._keys[key]
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    @staticmethod
    async def _acquire_file(path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            log.info("waiting for the prepare lock %s held by another plugin instance", path)
        except BaseException:
            os.close(fd)
            raise
        fut = asyncio.ensure_future(asyncio.to_thread(_lock_fd, fd))
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(lambda f: _close_after(f, fd))
            raise
        except BaseException:
            os.close(fd)
            raise
        return fd


class KeyedHold:
    """One claim's hold on its keys (:meth:`ClaimLock.keyed`)."""

    def __init__(self, lock: ClaimLock, keys: list[str]) -> None:
        self.lock = lock
        self.keys = keys

    async def __aenter__(self) -> KeyedHold:
        await self.lock._enter_keys(self.keys)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lock._leave_keys(self.keys)
