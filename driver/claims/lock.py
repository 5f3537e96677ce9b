"""The one lock of prepare and unprepare, within this process and across processes.

Claims are prepared and unprepared one call at a time: calls race on the
checkpoint, the CDI specs and the devices otherwise. During a rolling update
(kubelet 1.33+) two plugin pods of patchbay run on one node at once, each
with its own sockets, and the kubelet may call either, so the same holds
across the two processes. :class:`ClaimLock` is the one mechanism for both:
an ``asyncio.Lock`` (callers in this process queue on the event loop, never
on threads) and then, if a lock file is configured, an exclusive
``fcntl.flock`` on a file in the plugin directory, which both pods share
through the host path. The claim preparer (``driver.claims.preparer``) owns
it and takes it around every prepare, unprepare and start-up recovery.

Concurrency model: the blocking ``flock`` call runs in a worker thread via
``asyncio.to_thread`` so the event loop keeps serving; if the waiting task is
cancelled, the lock the thread still obtains is released as soon as it is.
``flock`` locks belong to the open file description and vanish when the
process dies, so a crashed pod never leaves the other one stuck.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
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
    """An async context manager: ``async with lock: ...`` runs the body alone.

    With ``path=None`` only this process is serialised (no rolling update).
    """

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._local = asyncio.Lock()
        self._fd: int | None = None

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def shared(self) -> bool:
        """Whether another process takes this lock too (a rolling update): then
        the state it guards (the checkpoint) may change while it is not held."""
        return self._path is not None

    async def __aenter__(self) -> ClaimLock:
        await self._local.acquire()
        try:
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
