"""Turn the node's full GPUs into the MIG view: counter sets and partitions.

The GPU family (``driver.gpu.kind``) scans full GPUs as always and hands
them here when dynamic MIG is on. For each GPU the policy lets us partition
we add its counter set and one device per offered (profile, placement), and
make its full-GPU device consume the whole set. On Ampere a partitionable
GPU is one an operator already put in MIG mode, and its full-GPU device is
left out (in MIG mode the GPU cannot be used whole). The first scan also
runs the start-up ownership check (``driver.mig.startup``). The checkpoint
comes from the process's one store (``driver.checkpoint``), which the
full-GPU guard follows from then on (:meth:`MigSupport.follow`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from driver.checkpoint import Checkpoint, CheckpointStore
from driver.devices.kind import Discovery
from driver.devices.model import CounterSet, Device
from driver.gpu.discovery import gpu_number
from driver.gpu.scan import FullGpus
from driver.mig.guard import MigGuard
from driver.mig.handler import MigHandler
from driver.mig.layout import counter_set, full_gpu, mig_devices
from driver.mig.order import preference_order
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession, toggles_mig_mode
from driver.mig.startup import orphans, ownership
from driver.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)


class MigSupport:
    """Dynamic MIG for the GPUs of one node: discovery, handler, guard."""

    def __init__(
        self,
        session: NvmlSession,
        policy: MigPolicy,
        handler_factory: Callable[[NvmlSession, MigGuard], MigHandler],
        load_checkpoint: Callable[[], Checkpoint],
        cleanup_allowed: bool = True,
    ) -> None:
        self.session = session
        self.policy = policy
        self.guard = MigGuard(session)
        self.handler = handler_factory(session, self.guard)
        self._load_checkpoint = load_checkpoint
        self._cleanup = policy.orphan_cleanup and cleanup_allowed
        self._started = False

    def follow(self, checkpoint: Checkpoint) -> None:
        """The checkpoint was read (again): the guard holds what it records."""
        owned = ownership(checkpoint)
        self.guard.follow(owned.full_gpus, owned.sharers)

    @property
    def lock(self) -> threading.RLock:
        """The NVML session lock (``driver.gpu.kind.Partitions``)."""
        return self.session.lock

    def discover(self, full_gpus: FullGpus) -> Discovery:
        """The full GPUs plus MIG counter sets and devices, in preference order,
        from one enumeration of NVML."""
        sets: list[CounterSet] = []
        migs: list[Device] = []
        full: list[Device] = []
        with self.session.open() as nvml:
            listed = nvml.gpus()
            gpus = full_gpus(nvml.system_info(), listed)
            infos = {g.uuid: g for g in listed}
            managed = [g for g in infos.values() if self.policy.partitionable(g)]
            if not self._started:
                owned = ownership(self._load_checkpoint())
                self.guard.follow(owned.full_gpus, owned.sharers)
                orphans(nvml, managed, owned, self._cleanup)
                self._started = True
            for device in gpus:
                info = infos.get(device.local_id)
                if info is None or info not in managed:
                    full.append(device)
                    continue
                profiles = [p for p in nvml.mig_profiles(info.uuid) if self.policy.offers(p)]
                if not profiles:
                    full.append(device)
                    continue
                number = gpu_number(device)  # the GPU's name's, local GPUs first
                sets.append(counter_set(number))
                migs += mig_devices(device, number, profiles)
                if toggles_mig_mode(info):
                    full.append(full_gpu(device, number))
                else:
                    log.info("GPU %s (Ampere, MIG mode on): offered as partitions only", info.uuid)
        return Discovery(devices=tuple(preference_order(full, migs)), counter_sets=tuple(sets))


def mig_support(
    backend: NvmlBackend,
    gpus: str,
    profiles: str,
    media_extensions: bool,
    orphan_cleanup: bool,
    *,
    dev_root: Path,
    checkpoint: CheckpointStore,
    shared_checkpoint: bool,
) -> MigSupport | None:
    """Dynamic MIG from the plugin's settings; None when no GPU is selected.
    ``checkpoint`` is the process's one store, which the guard follows.

    With a shared checkpoint (rolling update: another plugin process may be
    creating an instance right now) orphans are only reported, never destroyed.
    """
    policy = MigPolicy.parse(gpus, profiles, media_extensions, orphan_cleanup)
    if not policy.enabled:
        return None
    if orphan_cleanup and shared_checkpoint:
        log.warning("MIG orphan cleanup is off during rolling updates (shared checkpoint)")
    support = MigSupport(
        NvmlSession(backend),
        policy,
        lambda session, guard: MigHandler(session, guard, dev_root),
        checkpoint.current,
        cleanup_allowed=not shared_checkpoint,
    )
    checkpoint.follow(support.follow)
    return support
