"""Keep a full-GPU claim and MIG partitions of the same GPU apart.

The counters already stop the scheduler from allocating both; this guard is
the node's own check, for what the scheduler cannot know (instances an
operator or a crash left behind, a GPU still in MIG mode). A full-GPU claim
on a partitionable GPU is refused while instances exist, and switches MIG
mode off first on Hopper (a GPU in MIG mode is not usable whole); a MIG
claim is refused while a full-GPU claim holds the GPU. Shares of a GPU
(``driver.gpu.hami``) hold it whole together: the first acquires it, the
last releases it. The holders are kept in memory, seeded from the
checkpoint at start (``driver.mig.startup``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from driver.errors import ClaimError
from driver.mig.session import NvmlSession, find_gpu, toggles_mig_mode

log = logging.getLogger(__name__)


class MigGuard:
    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._full: set[str] = set()
        self._sharers: dict[str, set[str]] = {}

    def seed(
        self, full_gpu_uuids: Iterable[str], sharers: Mapping[str, Iterable[str]] | None = None
    ) -> None:
        with self._session.lock:
            self._full.update(full_gpu_uuids)
            for uuid, claims in (sharers or {}).items():
                self._sharers.setdefault(uuid, set()).update(claims)

    def full_held(self, uuid: str) -> bool:
        with self._session.lock:
            return uuid in self._full

    def acquire_full(self, uuid: str) -> None:
        """Make ``uuid`` usable whole and mark it held, or raise ClaimError."""
        with self._session.open() as nvml:
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
            self._full.discard(uuid)

    def share(self, uuid: str, claim_uid: str) -> None:
        """A share of ``uuid`` for ``claim_uid``: the first one acquires it whole."""
        with self._session.lock:
            if not self._sharers.get(uuid):
                self.acquire_full(uuid)
            self._sharers.setdefault(uuid, set()).add(claim_uid)

    def unshare(self, uuid: str, claim_uid: str) -> None:
        """``claim_uid``'s share of ``uuid`` ends: the last one releases it."""
        with self._session.lock:
            sharers = self._sharers.get(uuid, set())
            sharers.discard(claim_uid)
            if not sharers:
                self._sharers.pop(uuid, None)
                self._full.discard(uuid)
