"""Keep a full-GPU claim and MIG partitions of the same GPU apart.

The counters already stop the scheduler from allocating both; this guard is
the node's own check, for what the scheduler cannot know (instances an
operator or a crash left behind, a GPU still in MIG mode). A full-GPU claim
on a partitionable GPU is refused while instances exist, and switches MIG
mode off first on Hopper (a GPU in MIG mode is not usable whole); a MIG
claim is refused while a full-GPU claim holds the GPU. The holders are kept
in memory, seeded from the checkpoint at start (``driver.mig.startup``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from driver.errors import ClaimError
from driver.mig.session import NvmlSession, find_gpu, toggles_mig_mode

log = logging.getLogger(__name__)


class MigGuard:
    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._full: set[str] = set()

    def seed(self, full_gpu_uuids: Iterable[str]) -> None:
        with self._session.lock:
            self._full.update(full_gpu_uuids)

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
