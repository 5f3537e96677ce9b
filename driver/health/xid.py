"""A thread that waits for GPU XID events through NVML.

Why: NVML delivers XIDs through an event set that must stay registered
while the plugin runs; a wait blocks, so it gets a thread of its own. The
thread holds one NVML initialisation for the life of its event set (NVML
counts initialisations, so the scans' own init/shutdown pairs never pull the
library from under it) and takes the plugin's NVML session lock only to
build or drop the set, never while it waits. When the set of GPUs changes
(hot-plug) the set is rebuilt; an NVML error backs off and retries, it never
ends the thread. :meth:`XidWatcher.paused` lets go of the event set and the
NVML initialisation for a while: a GPU reset is refused while any process,
a monitoring one included, holds the GPU (:mod:`driver.health.reset`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from driver.backoff import Backoff
from driver.errors import PatchbayError
from driver.nvml.backend import EventWatcher, NvmlBackend

log = logging.getLogger(__name__)

# How long one NVML wait blocks: NVML cannot be interrupted, so this bounds
# how late a changed GPU set (hot-plug) or a stop is seen. Each timeout costs
# the idle plugin a wake-up (about 0.3 ms of CPU through pynvml): 500 ms cost
# 0.06 % of a core at rest, 2 s costs 0.015 %.
WAIT_MS = 2000
BACKOFF_S = (1.0, 30.0)


class XidWatcher:
    def __init__(
        self,
        backend: NvmlBackend,
        on_xid: Callable[[str, int], None],
        lock: threading.RLock | None = None,
    ) -> None:
        self._backend = backend
        self._on_xid = on_xid
        self._lock = lock if lock is not None else threading.RLock()
        self._wanted: tuple[str, ...] = ()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._pauses = 0  # paused() callers; the thread holds nothing while > 0
        self._idle = threading.Event()  # set while the thread holds no NVML
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)

    def start(self) -> XidWatcher:
        self._thread.start()
        return self

    def set_gpus(self, uuids: Sequence[str]) -> None:
        with self._changed:
            self._wanted = tuple(sorted(uuids))
            self._changed.notify_all()

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=5)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold no event set and no NVML initialisation inside the block (the
        thread lets go within one wait, WAIT_MS); XIDs queued meanwhile come
        after it."""
        with self._changed:
            self._pauses += 1
            self._changed.notify_all()
        try:
            if self._thread.is_alive() and not self._idle.wait(WAIT_MS / 1000 * 3):
                log.warning("XID watcher still holds NVML after %d ms", WAIT_MS * 3)
            yield
        finally:
            with self._changed:
                self._pauses -= 1
                self._changed.notify_all()

    def _run(self) -> None:
        backoff = Backoff(*BACKOFF_S)
        while not self._stop.is_set():
            with self._changed:
                uuids = self._wanted
                if not uuids or self._pauses:
                    self._idle.set()
                    self._changed.wait(1.0)
                    continue
                self._idle.clear()
            try:
                self._watch(uuids)
                backoff.reset()
            except (PatchbayError, OSError) as exc:
                self._idle.set()  # _watch let go of what it took
                log.warning("XID watch failed (retry in %.0fs): %s", backoff.delay, exc)
                self._stop.wait(backoff.next())

    def _watch(self, uuids: tuple[str, ...]) -> None:
        with self._lock:
            self._backend.init()
            try:
                watcher: EventWatcher = self._backend.watch_events(uuids)
            except BaseException:
                self._backend.shutdown()
                raise
        log.info("watching XIDs of %d GPU(s)", len(uuids))
        try:
            while not self._stop.is_set() and self._wanted == uuids and not self._pauses:
                for event in watcher.wait(WAIT_MS):
                    self._on_xid(event.uuid, event.xid)
        finally:
            with self._lock, contextlib.suppress(PatchbayError, OSError):
                watcher.close()
            with self._lock, contextlib.suppress(PatchbayError, OSError):
                self._backend.shutdown()
