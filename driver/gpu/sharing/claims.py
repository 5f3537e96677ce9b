"""The preparer's claim-wide step for ``GpuConfig.sharing``.

Sharing applies, as in NVIDIA's driver, to the GPUs of one claim shared by
that claim's consumers (its containers and pods). :meth:`GpuSharing.plan`
turns each GPU's config into undo data (strategy, UUID, interval, the MPS
directory and limits), which the preparer checkpoints before
:meth:`GpuSharing.apply` changes anything, so :meth:`GpuSharing.undo` can
always reverse it from the checkpoint alone. ``apply`` is idempotent: start-up
runs it again for prepared claims, which adopts a surviving MPS daemon (or
starts a lost one) and re-applies an interval or compute mode a reboot of
the GPU reset.

- TimeSlicing: ``nvidia-smi compute-policy --set-timeslice <n>`` on the
  claim's GPUs at prepare, ``0`` (Default) at unprepare; no CDI edits.
- MPS: compute mode EXCLUSIVE_PROCESS through NVML (always the plugin's), one
  control daemon for the claim's GPUs (wanted through ``handoff``, run by the
  MPS supervisor or by the plugin itself); containers get the pipe directory
  (read-write) and the log directory, ``CUDA_MPS_PIPE_DIRECTORY``,
  ``CUDA_MPS_LOG_DIRECTORY`` and, from the config, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``<i>=<n>M`` per GPU, ``i`` the GPU's
  index in the claim's ``NVIDIA_VISIBLE_DEVICES``, as the container sees
  it). Unprepare stops the daemon, removes its directories and sets compute
  mode DEFAULT.
- Exclusive (or no ``sharing``): nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.cdi import ContainerEdits
from driver.config.opaque import DeviceConfig, GpuConfig
from driver.devices.model import Device
from driver.errors import ConfigError, NvmlError
from driver.faults import crash_point
from driver.gpu.sharing.handoff import MpsHandoff
from driver.gpu.sharing.timeslice import NvidiaSmi
from driver.nvml.backend import ComputeMode, NvmlBackend, NvmlReturn

log = logging.getLogger(__name__)

KEY = "sharing"  # the device record's undo entry
PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
LOG_IN_CONTAINER = "/var/log/nvidia-mps"
_GONE = (NvmlReturn.NOT_FOUND, NvmlReturn.GPU_IS_LOST)


class GpuSharing:
    """:class:`driver.devices.handler.ClaimSharing` for full GPUs."""

    def __init__(
        self,
        nvml: NvmlBackend,
        nvidia_smi: Path,
        mps: MpsHandoff,
        lock: threading.RLock | None = None,
    ) -> None:
        self._nvml = nvml
        # The NVML session lock scans and MIG changes hold (with dynamic MIG).
        self._lock = lock or threading.RLock()
        self._smi = NvidiaSmi(nvidia_smi)
        self._mps = mps

    def plan(
        self, claim_uid: str, devices: Sequence[tuple[Device, DeviceConfig | None]]
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        visible = 0  # the device's index in the claim's NVIDIA_VISIBLE_DEVICES
        for device, config in devices:
            index, visible = visible, visible + (device.kind in ("gpu", "mig"))
            sharing = config.sharing if isinstance(config, GpuConfig) else None
            if sharing is None or sharing.strategy == "Exclusive":
                out.append({})
                continue
            if device.kind != "gpu":
                raise ConfigError(
                    f"device {device.name}: sharing.strategy {sharing.strategy} applies to "
                    f"full GPUs, not to a {device.kind} device"
                )
            entry: dict[str, Any] = {"strategy": sharing.strategy, "uuid": device.local_id}
            entry["index"] = index
            if sharing.strategy == "TimeSlicing":
                entry["timeslice"] = sharing.timeslice
            else:
                mps = sharing.mps
                entry["dir"] = str(self._mps.directory(claim_uid))
                entry["threads"] = mps.default_active_thread_percentage if mps else None
                entry["pinned_mib"] = mps.pinned_mib if mps else None
            out.append({KEY: entry})
        if len({e[KEY]["strategy"] for e in out if e}) > 1:
            raise ConfigError("sharing.strategy: one claim's GPUs share one way (configs differ)")
        return out

    def involved(self, undos: Sequence[Mapping[str, Any]]) -> bool:
        return any(KEY in u for u in undos)

    def apply(self, claim_uid: str, undos: Sequence[Mapping[str, Any]]) -> ContainerEdits | None:
        entries = [u[KEY] for u in undos if KEY in u]
        if not entries:
            return None
        uuids = [e["uuid"] for e in entries]
        if entries[0]["strategy"] == "TimeSlicing":
            self._smi.set_timeslice(uuids, int(entries[0]["timeslice"]))
            return None
        self._set_modes(uuids, ComputeMode.EXCLUSIVE_PROCESS)
        crash_point("sharing-compute-mode-set")
        first = entries[0]
        directory = Path(first["dir"])
        pinned = {e["uuid"]: e["pinned_mib"] for e in entries if e.get("pinned_mib")}
        self._mps.ensure(directory, uuids, first.get("threads"), pinned)
        crash_point("sharing-mps-started")
        pipe, logs = self._mps.dirs(directory)
        env = [f"CUDA_MPS_PIPE_DIRECTORY={PIPE_IN_CONTAINER}"]
        env.append(f"CUDA_MPS_LOG_DIRECTORY={LOG_IN_CONTAINER}")
        if first.get("threads") is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={first['threads']}")
        limits = [
            f"{e.get('index', i)}={e['pinned_mib']}M"
            for i, e in enumerate(entries)
            if e.get("pinned_mib")
        ]
        if limits:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
        return ContainerEdits(
            env=tuple(env),
            mounts=((str(logs), LOG_IN_CONTAINER),),
            writable_mounts=((str(pipe), PIPE_IN_CONTAINER),),
        )

    def undo(self, claim_uid: str, undos: Sequence[Mapping[str, Any]]) -> None:
        entries = [u[KEY] for u in undos if KEY in u]
        if not entries:
            return
        uuids = [e["uuid"] for e in entries]
        if entries[0]["strategy"] == "TimeSlicing":
            self._smi.set_timeslice(uuids, 0)
            return
        self._mps.stop(Path(entries[0]["dir"]))
        crash_point("sharing-mps-stopped")
        self._set_modes(uuids, ComputeMode.DEFAULT)

    def _set_modes(self, uuids: Sequence[str], mode: ComputeMode) -> None:
        """Set each GPU's compute mode in one NVML session; resetting a GPU
        that is gone (removed, fallen off the bus) has nothing left to do."""
        with self._lock, contextlib.ExitStack() as stack:
            self._nvml.init()
            stack.callback(self._nvml.shutdown)
            for uuid in uuids:
                try:
                    self._nvml.set_compute_mode(uuid, mode)
                except NvmlError as exc:
                    if mode != ComputeMode.DEFAULT or exc.code not in _GONE:
                        raise
                    log.info("GPU %s is gone: no compute mode to reset", uuid)
