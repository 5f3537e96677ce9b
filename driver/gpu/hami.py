"""Prepare a share of a fractional GPU: the GPU's CDI edits plus HAMi-core's limits.

The preparer hands the handler the shared device as this claim was allocated
it: ``capacity`` is the claim's ``consumedCapacity`` (``memory``, ``cores``),
not the GPU's total. The limits go out as HAMi-core reads them, one pair per
GPU of the claim, numbered by the GPU's position in the claim's
``NVIDIA_VISIBLE_DEVICES`` (``Preparation.indexed_env``):
``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` and, when the claim consumed cores,
``CUDA_DEVICE_SM_LIMIT_<i>=<percent>``.

The limits bind only where HAMi-core's ``libvgpu.so`` is loaded. With
``--hami-core-library`` set, each share mounts that file at
``/usr/local/vgpu/libvgpu.so`` and a preload list naming it at
``/etc/ld.so.preload`` (both read-only), as HAMi's device plugin does, so
the dynamic linker loads it into every process of the container; without
the setting the limits are advisory (docs/sharing.md).

With dynamic MIG the first share claims the GPU whole through the MIG guard
(no instances, MIG mode off on Hopper) and the last one releases it; the
guard counts the sharers, seeded from the checkpoint at start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from driver.atomicfile import write_atomic
from driver.cdi import ContainerEdits
from driver.config.opaque import DeviceConfig
from driver.devices import quantity
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.gpu.fraction import CORES, KIND, MEMORY, MIB
from driver.gpu.prepare import GpuHandler, WholeGpuGuard

log = logging.getLogger(__name__)

MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"


class ShareGuard(WholeGpuGuard, Protocol):
    """Claims a partitionable GPU for its sharers (``driver.mig.guard.MigGuard``):
    whole for the first, released with the last."""

    def share(self, uuid: str, claim_uid: str) -> None: ...
    def unshare(self, uuid: str, claim_uid: str) -> None: ...


def limits(consumed: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """HAMi-core's limits for one share, unnumbered: ``(variable, value)``."""
    out = []
    if MEMORY in consumed:
        out.append((MEMORY_LIMIT, f"{int(quantity.parse(consumed[MEMORY])[0] // MIB)}m"))
    cores = int(quantity.parse(consumed.get(CORES, "0"))[0])
    if cores > 0:
        out.append((SM_LIMIT, str(cores)))
    return tuple(out)


class SharedGpuHandler:
    """The :class:`driver.devices.handler.DeviceHandler` for shares of a GPU."""

    kind = KIND
    has_side_effects = False

    def __init__(
        self,
        gpus: GpuHandler,
        library: Path | None = None,
        state_dir: Path | None = None,
        guard: ShareGuard | None = None,
    ) -> None:
        self._gpus = gpus
        self._guard = guard
        self.blocking = guard is not None
        self._mounts: tuple[tuple[str, str], ...] = ()
        if library is not None:
            if state_dir is None:
                raise ValueError("a HAMi-core library needs a state directory for its preload list")
            preload = state_dir / "hami-ld.so.preload"
            state_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(preload, f"{LIBRARY_IN_CONTAINER}\n".encode())
            self._mounts = (
                (str(library), LIBRARY_IN_CONTAINER),
                (str(preload), PRELOAD_IN_CONTAINER),
            )

    def plan_undo(self, device: Device, config: DeviceConfig | None = None) -> dict[str, Any]:
        return {}

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        if self._guard is not None and device.has_counters():
            self._guard.share(device.local_id, claim_uid)
        whole = self._gpus.prepare(device, claim_uid, config)
        return Preparation(
            edits=ContainerEdits(
                env=whole.edits.env, device_nodes=whole.edits.device_nodes, mounts=self._mounts
            ),
            undo={"claim": claim_uid, "consumed": dict(device.capacity)},
            claim_lists=whole.claim_lists,
            indexed_env=limits(device.capacity),
        )

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        if self._guard is not None:
            self._guard.unshare(local_id, str(undo.get("claim", "")))

    def common_edits(self) -> ContainerEdits | None:
        return self._gpus.common_edits()
