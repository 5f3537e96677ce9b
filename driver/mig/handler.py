"""Prepare a MIG device: create its GPU and compute instance at the placement.

Sequence on prepare (all under the NVML session lock): refuse if a
full-GPU claim holds the GPU; on Hopper switch MIG mode on if it is off
(Ampere: only GPUs an operator put in MIG mode are published); remove
debris at exactly this placement (no claim can own it: the preparer refuses
two claims on one placement, and undoes a stale record before retrying);
create the GI at the allocated start, then its CI. If the CI fails the GI is
destroyed before the error goes up, and the preparer's rollback then runs
``unprepare``, which also switches MIG mode off again if nothing is left.

``plan_undo`` records (GPU UUID, profile id, start) before anything happens,
so a crash between GI and CI creation (crash point ``mig-gi-created``) is
undone on the next prepare or unprepare by finding the instance at that
placement. Unprepare destroys CI then GI, and on Hopper ends MIG mode when
the GPU's last instance is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from driver.cdi import ContainerEdits, DeviceNode
from driver.config.opaque import DeviceConfig, GpuConfig
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.errors import ClaimError
from driver.faults import crash_point
from driver.gpu.prepare import VISIBLE_DEVICES, GpuHandler
from driver.mig.guard import MigGuard
from driver.mig.layout import KIND, parse_local_id
from driver.mig.session import NvmlSession, find_gpu, toggles_mig_mode
from driver.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)

CRASH_AFTER_GI = "mig-gi-created"
# /proc/driver/nvidia-caps/mig-minors: after "config" (1) and "monitor" (2),
# per GPU 15 GIs, each "access" followed by 8 CIs' "access".
_CAPS_PER_GI = 9
_CAPS_PER_GPU = 15 * _CAPS_PER_GI


def gi_cap_minor(gpu_minor: int, gi_id: int) -> int:
    return 3 + gpu_minor * _CAPS_PER_GPU + gi_id * _CAPS_PER_GI


def ci_cap_minor(gpu_minor: int, gi_id: int, ci_id: int) -> int:
    return gi_cap_minor(gpu_minor, gi_id) + 1 + ci_id


class MigHandler:
    """The :class:`driver.devices.handler.DeviceHandler` for MIG devices."""

    kind = KIND
    has_side_effects = True
    blocking = True

    def __init__(self, session: NvmlSession, guard: MigGuard, dev_root: Path) -> None:
        self._session = session
        self._guard = guard
        self._nodes = GpuHandler(dev_root)
        self._dev_root = dev_root

    def plan_undo(self, device: Device, config: DeviceConfig | None = None) -> dict[str, Any]:
        uuid, profile_id, start = parse_local_id(device.local_id)
        return {"gpu": uuid, "profileId": profile_id, "start": start}

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        uuid, profile_id, start = parse_local_id(device.local_id)
        with self._session.open() as nvml:
            if self._guard.full_held(uuid):
                raise ClaimError(f"GPU {uuid} is held whole by a claim; no MIG on it now")
            gpu = find_gpu(nvml, uuid)
            if gpu is None:
                raise ClaimError(f"GPU {uuid} is not present")
            if not gpu.mig_mode_current:
                if not toggles_mig_mode(gpu):
                    raise ClaimError(f"GPU {uuid} is not in MIG mode (Ampere: operator's job)")
                log.info("switching MIG mode on for %s (first partition)", uuid)
                current, _ = nvml.set_mig_mode(uuid, True)
                if not current:
                    raise ClaimError(f"GPU {uuid}: MIG mode did not switch on")
            self._destroy_at(nvml, uuid, profile_id, start, "debris at the allocated placement")
            gi_id = nvml.create_gpu_instance(uuid, profile_id, start)
            crash_point(CRASH_AFTER_GI)
            try:
                instance = nvml.create_compute_instance(uuid, gi_id)
            except Exception:
                log.warning("CI creation failed on %s GI %d; destroying the GI", uuid, gi_id)
                nvml.destroy_mig(uuid, gi_id)
                raise
        if not instance.mig_uuid:
            raise ClaimError(f"GPU {uuid} GI {gi_id}: no MIG device UUID reported")
        log.info(
            "claim %s: MIG %s (profile %d at %d) is GI %d CI %s on %s",
            claim_uid, instance.mig_uuid, profile_id, start, gi_id, instance.ci_id, uuid,
        )  # fmt: skip
        edits = self._edits(gpu.minor, gi_id, instance.ci_id or 0, config)
        return Preparation(
            edits=edits,
            undo={"giId": gi_id, "migUUID": instance.mig_uuid},
            claim_lists=((VISIBLE_DEVICES, instance.mig_uuid),),
        )

    def prepare_admin(self, device: Device, holder: Mapping[str, Any] | None) -> Preparation:
        """Admin access (``driver.claims.admin``): the MIG device another claim
        created, found read-only; admin access never creates or destroys one."""
        uuid, profile_id, start = parse_local_id(device.local_id)
        with self._session.open() as nvml:
            gpu = find_gpu(nvml, uuid)
            found = [
                i for i in (nvml.mig_instances(uuid) if gpu is not None else ())
                if i.profile_id == profile_id and i.start == start and i.mig_uuid
            ]  # fmt: skip
        if gpu is None or holder is None or not found:
            raise ClaimError(
                f"MIG device {device.name} is not created (no claim holds it): "
                "admin access shows only a MIG device that exists"
            )
        instance = found[0]
        return Preparation(
            edits=self._edits(gpu.minor, instance.gi_id, instance.ci_id or 0, None),
            claim_lists=((VISIBLE_DEVICES, str(instance.mig_uuid)),),
        )

    def _edits(
        self, minor: int, gi_id: int, ci_id: int, config: DeviceConfig | None
    ) -> ContainerEdits:
        env = []
        if isinstance(config, GpuConfig) and config.driver_capabilities:
            env.append(f"NVIDIA_DRIVER_CAPABILITIES={','.join(config.driver_capabilities)}")
        nodes = [self._nodes.node(f"nvidia{minor}", minor)]
        for cap in (gi_cap_minor(minor, gi_id), ci_cap_minor(minor, gi_id, ci_id)):
            nodes.append(self._cap_node(cap))
        return ContainerEdits(env=tuple(env), device_nodes=tuple(n for n in nodes if n))

    def _cap_node(self, minor: int) -> DeviceNode | None:
        """A MIG capability node, only when the host has it as a character
        device: its major is dynamic, and a guessed one could open another device."""
        node = self._nodes.node(f"nvidia-caps/nvidia-cap{minor}", None)
        return node if node is not None and node.host_path is not None else None

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        uuid, profile_id, start = parse_local_id(local_id)
        with self._session.open() as nvml:
            gpu = find_gpu(nvml, str(undo.get("gpu", uuid)))
            if gpu is None:
                log.warning("GPU %s is gone; its MIG instance went with it", uuid)
                return
            self._destroy_at(nvml, uuid, int(undo.get("profileId", profile_id)),
                             int(undo.get("start", start)), "released")  # fmt: skip
            if toggles_mig_mode(gpu) and gpu.mig_mode_current and not nvml.mig_instances(uuid):
                log.info("switching MIG mode off for %s (last partition gone)", uuid)
                nvml.set_mig_mode(uuid, False)

    @staticmethod
    def _destroy_at(nvml: NvmlBackend, uuid: str, profile_id: int, start: int, why: str) -> None:
        found = {
            i.gi_id
            for i in nvml.mig_instances(uuid)
            if i.profile_id == profile_id and i.start == start
        }
        for gi_id in sorted(found):
            log.info("destroying GI %d (profile %d at %d) on %s: %s", gi_id, profile_id,
                     start, uuid, why)  # fmt: skip
            nvml.destroy_mig(uuid, gi_id)

    def common_edits(self) -> ContainerEdits | None:
        return self._nodes.common_edits()
