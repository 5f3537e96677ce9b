"""Keep a full-GPU claim and MIG partitions of the same GPU apart.

The counters already stop the scheduler from allocating both; this guard is
the node's own check, for what the scheduler cannot know (instances an
operator or a crash left behind, a GPU still in MIG mode). A full-GPU claim
on a partitionable GPU is refused while instances exist, and switches MIG
mode off first on Hopper (a GPU in MIG mode is not usable whole); a MIG
claim is refused while a full-GPU claim holds the GPU. Shares of a GPU
(``driver.gpu.hami``) hold it whole together: the first acquires it, the
last releases it. The holders are kept in memory, seeded from the
checkpoint at start (``driver.mig.startup``) and replaced by what the
checkpoint says each time it is read again: during a rolling update two
plugin processes share the checkpoint, and a GPU the other one claimed whole
is held here too (``driver.mig.discovery`` subscribes :meth:`MigGuard.follow`
to the process's one checkpoint store). Only the preparer re-reads the file,
under the prepare lock, before any handler runs; the holders it brings are
taken over at the guard's next use, so a reader on another thread never
blocks on the NVML session lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from driver.errors import ClaimError
from driver.mig.session import NvmlSession, find_gpu, toggles_mig_mode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Recorded:
    """The holders a checkpoint read records, not yet taken over."""

    full: frozenset[str]
    sharers: Mapping[str, frozenset[str]]


class MigGuard:
    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._full: set[str] = set()
        self._sharers: dict[str, set[str]] = {}
        self._recorded: _Recorded | None = None
        self._recorded_lock = threading.Lock()  # never held while waiting for NVML

    def follow(
        self, full_gpu_uuids: Iterable[str], sharers: Mapping[str, Iterable[str]] | None = None
    ) -> None:
        """The holders the checkpoint records now (just read): they replace
        the guard's at its next use, without waiting for the session lock."""
        recorded = _Recorded(
            frozenset(full_gpu_uuids),
            {uuid: frozenset(claims) for uuid, claims in (sharers or {}).items()},
        )
        with self._recorded_lock:
            self._recorded = recorded

    def _take_over(self) -> None:
        """Under the session lock: adopt the holders last recorded."""
        with self._recorded_lock:
            recorded, self._recorded = self._recorded, None
        if recorded is not None:
            self._full = set(recorded.full)
            self._sharers = {uuid: set(claims) for uuid, claims in recorded.sharers.items()}

    def full_held(self, uuid: str) -> bool:
        with self._session.lock:
            self._take_over()
            return uuid in self._full

    def acquire_full(self, uuid: str) -> None:
        """Make ``uuid`` usable whole and mark it held, or raise ClaimError."""
        with self._session.open() as nvml:
            self._take_over()
            gpu = find_gpu(nvml, uuid)
            if gpu is None:
                raise ClaimError(f"GPU {uuid} is not present")
            instances = nvml.mig_instances(uuid) if gpu.mig_mode_current else []
            if instances:
                raise ClaimError(
                    f"GPU {uuid} still holds {len({i.gi_id for i in instances})} MIG "
                    "instances; the full GPU is free once they are released"
                )
            if gpu.mig_mode_current:
                if not toggles_mig_mode(gpu):
                    raise ClaimError(f"GPU {uuid} is in MIG mode, which only an operator can end")
                log.info("switching MIG mode off on %s for a full-GPU claim", uuid)
                nvml.set_mig_mode(uuid, False)
            self._full.add(uuid)

    def release_full(self, uuid: str) -> None:
        with self._session.lock:
            self._take_over()
            self._full.discard(uuid)

    def share(self, uuid: str, claim_uid: str) -> None:
        """A share of ``uuid`` for ``claim_uid``: the first one acquires it whole."""
        with self._session.lock:
            self._take_over()
            if not self._sharers.get(uuid):
                self.acquire_full(uuid)
            self._sharers.setdefault(uuid, set()).add(claim_uid)

    def unshare(self, uuid: str, claim_uid: str) -> None:
        """``claim_uid``'s share of ``uuid`` ends: the last one releases it."""
        with self._session.lock:
            self._take_over()
            sharers = self._sharers.get(uuid, set())
            sharers.discard(claim_uid)
            if not sharers:
                self._sharers.pop(uuid, None)
                self._full.discard(uuid)
