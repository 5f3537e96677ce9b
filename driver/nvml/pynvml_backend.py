"""The real NVML backend: discovery and MIG through ``pynvml``.

The real counterpart of :mod:`driver.nvml.fake`. It and its siblings
:mod:`driver.nvml.pynvml_library` (loading the library, mapping errors) and
:mod:`driver.nvml.pynvml_events` (XID events) are the only modules that
import ``pynvml`` (an import-linter contract). Every call blocks; the plugin
runs them in a worker thread.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.backend import (
    ARCHITECTURES,
    BRANDS,
    GpmSample,
    GpuInfo,
    MigInstance,
    MigProfile,
    NvmlReturn,
    ProcessUtilization,
    SystemInfo,
    counts_errors,
    cuda_version,
    normalize_bus_id,
    nvml_error,
    short_profile_name,
)
from driver.nvml.condition import GpuCondition
from driver.nvml.library import not_found_message
from driver.nvml.pynvml_condition import read_condition
from driver.nvml.pynvml_events import PynvmlEventWatcher
from driver.nvml.pynvml_library import call, code_of, preload_library
from driver.nvml.pynvml_utilization import (
    PynvmlGpmSample,
    gpu_utilization,
    mig_sample,
    process_utilization,
    sm_utilization,
)

log = logging.getLogger(__name__)

GI_PROFILES = range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
CI_PROFILES = range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
_SKIP = {NvmlReturn.NOT_SUPPORTED, NvmlReturn.INVALID_ARGUMENT}


@counts_errors
class PynvmlBackend:
    """:class:`driver.nvml.backend.NvmlBackend` over the real pynvml."""

    def __init__(self, driver_root: Path | None = None) -> None:
        self._driver_root = driver_root

    def init(self) -> None:
        preload_library(self._driver_root)
        try:
            call(pynvml.nvmlInit)
        except NvmlError as exc:
            if exc.code != NvmlReturn.LIBRARY_NOT_FOUND or self._driver_root is None:
                raise
            raise nvml_error(exc.code, not_found_message(self._driver_root)) from exc

    def shutdown(self) -> None:
        call(pynvml.nvmlShutdown)

    def system_info(self) -> SystemInfo:
        driver = call(pynvml.nvmlSystemGetDriverVersion)
        cuda = call(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        return SystemInfo(driver_version=driver, cuda_driver_version=cuda_version(cuda))

    def _handle(self, uuid: str) -> Any:
        return call(pynvml.nvmlDeviceGetHandleByUUID, uuid)

    def gpus(self) -> list[GpuInfo]:
        out = []
        for index in range(call(pynvml.nvmlDeviceGetCount)):
            try:
                out.append(self._gpu(index))
            except NvmlError as exc:
                if exc.code != NvmlReturn.GPU_IS_LOST:
                    raise
                log.warning("GPU %d is lost; leaving it out", index)
        return out

    def gpu(self, uuid: str) -> GpuInfo | None:
        try:
            return self._info(self._handle(uuid))
        except NvmlError as exc:
            if exc.code in (NvmlReturn.NOT_FOUND, NvmlReturn.GPU_IS_LOST):
                return None
            raise

    def _gpu(self, index: int) -> GpuInfo:
        return self._info(call(pynvml.nvmlDeviceGetHandleByIndex, index))

    def _info(self, h: Any) -> GpuInfo:
        major, minor = call(pynvml.nvmlDeviceGetCudaComputeCapability, h)
        memory = call(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
        try:
            current, pending = call(pynvml.nvmlDeviceGetMigMode, h)
            capable = True
        except NvmlError as exc:
            if exc.code != NvmlReturn.NOT_SUPPORTED:
                raise
            current = pending = 0
            capable = False
        return GpuInfo(
            index=call(pynvml.nvmlDeviceGetIndex, h),
            minor=call(pynvml.nvmlDeviceGetMinorNumber, h),
            uuid=call(pynvml.nvmlDeviceGetUUID, h),
            serial=call(pynvml.nvmlDeviceGetSerial, h),
            product_name=call(pynvml.nvmlDeviceGetName, h),
            brand=BRANDS.get(call(pynvml.nvmlDeviceGetBrand, h), "Unknown"),
            architecture=ARCHITECTURES.get(call(pynvml.nvmlDeviceGetArchitecture, h), "unknown"),
            cuda_compute_capability=f"{major}.{minor}",
            memory_bytes=int(memory.total),
            pci_bus_id=normalize_bus_id(call(pynvml.nvmlDeviceGetPciInfo_v3, h).busId),
            mig_capable=capable,
            mig_mode_current=bool(current),
            mig_mode_pending=bool(pending),
        )

    def set_mig_mode(self, uuid: str, enabled: bool) -> tuple[bool, bool]:
        h = self._handle(uuid)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        status = call(pynvml.nvmlDeviceSetMigMode, h, mode, device=True)
        if status != NvmlReturn.SUCCESS:
            log.info("MIG mode of %s pending (activation status %d)", uuid, status)
        current, pending = call(pynvml.nvmlDeviceGetMigMode, h)
        return bool(current), bool(pending)

    def mig_profiles(self, uuid: str) -> list[MigProfile]:
        h = self._handle(uuid)
        out = []
        for profile in GI_PROFILES:
            try:
                info = call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, profile, 2)
            except NvmlError as exc:
                if code_of(exc) in _SKIP:
                    continue
                raise
            out.append(self._profile(h, info))
        return sorted(out, key=lambda p: (p.memory_slots, p.compute_slices, p.media_engines))

    def _profile(self, h: Any, info: Any) -> MigProfile:
        count = ctypes.c_uint(info.instanceCount)
        array = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, info.instanceCount * 8))()
        count.value = len(array)
        call(
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            h,
            info.id,
            array,
            ctypes.byref(count),
        )
        placements = tuple((array[i].start, array[i].size) for i in range(count.value))
        return MigProfile(
            profile_id=info.id,
            name=short_profile_name(
                info.name.decode() if isinstance(info.name, bytes) else info.name
            ),
            compute_slices=info.sliceCount,
            memory_slots=placements[0][1] if placements else 0,
            memory_mib=int(info.memorySizeMB),
            multiprocessors=info.multiprocessorCount,
            media_engines=info.ofaCount > 0,
            placements=placements,
            max_count=info.instanceCount,
        )

    def _mig_uuids(self, h: Any) -> dict[tuple[int, int], str]:
        out = {}
        for index in range(call(pynvml.nvmlDeviceGetMaxMigDeviceCount, h)):
            try:
                mig = call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, index)
            except NvmlError as exc:
                if exc.code == NvmlReturn.NOT_FOUND:
                    break
                raise
            gi = call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
            ci = call(pynvml.nvmlDeviceGetComputeInstanceId, mig)
            out[(gi, ci)] = call(pynvml.nvmlDeviceGetUUID, mig)
        return out

    def mig_instances(self, uuid: str) -> list[MigInstance]:
        h = self._handle(uuid)
        try:
            current, _ = call(pynvml.nvmlDeviceGetMigMode, h)
        except NvmlError as exc:
            if exc.code != NvmlReturn.NOT_SUPPORTED:
                raise
            current = 0
        if not current:
            return []
        uuids = self._mig_uuids(h)
        out = []
        for profile in self.mig_profiles(uuid):
            array = (pynvml.c_nvmlGpuInstance_t * profile.max_count)()
            count = ctypes.c_uint(len(array))
            call(
                pynvml.nvmlDeviceGetGpuInstances, h, profile.profile_id, array, ctypes.byref(count)
            )
            for gi in array[: count.value]:
                info = call(pynvml.nvmlGpuInstanceGetInfo, gi)
                cis: list[int | None] = [*self._compute_instances(gi)] or [None]
                for ci in cis:
                    out.append(
                        MigInstance(
                            gi_id=info.id,
                            profile_id=info.profileId,
                            start=info.placement.start,
                            size=info.placement.size,
                            ci_id=ci,
                            mig_uuid=uuids.get((info.id, ci)) if ci is not None else None,
                        )
                    )
        return sorted(out, key=lambda m: (m.start, m.gi_id))

    def _ci_handles(self, gi: Any) -> list[Any]:
        """Every compute instance of a GPU instance, all CI profiles."""
        handles: list[Any] = []
        for profile in CI_PROFILES:
            array = (pynvml.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(len(array))
            try:
                call(
                    pynvml.nvmlGpuInstanceGetComputeInstances,
                    gi,
                    profile,
                    array,
                    ctypes.byref(count),
                )
            except NvmlError as exc:
                if code_of(exc) in _SKIP:
                    continue
                raise
            handles += array[: count.value]
        return handles

    def _compute_instances(self, gi: Any) -> list[int]:
        return sorted(call(pynvml.nvmlComputeInstanceGetInfo, ci).id for ci in self._ci_handles(gi))

    def create_gpu_instance(self, uuid: str, profile_id: int, start: int) -> int:
        h = self._handle(uuid)
        profile = next((p for p in self.mig_profiles(uuid) if p.profile_id == profile_id), None)
        if profile is None:
            raise nvml_error(NvmlReturn.INVALID_ARGUMENT, f"no profile {profile_id}", device=True)
        placement = pynvml.c_nvmlGpuInstancePlacement_t(start, profile.memory_slots)
        gi = call(
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            profile_id,
            ctypes.byref(placement),
            device=True,
        )
        return int(call(pynvml.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, uuid: str, gi_id: int) -> MigInstance:
        h = self._handle(uuid)
        gi = call(pynvml.nvmlDeviceGetGpuInstanceById, h, gi_id, device=True)
        info = call(pynvml.nvmlGpuInstanceGetInfo, gi)
        by_id = {p.profile_id: p for p in self.mig_profiles(uuid)}
        slices = by_id[info.profileId].compute_slices
        ci = call(
            pynvml.nvmlGpuInstanceCreateComputeInstance,
            gi,
            self._full_ci_profile(gi, slices),
            device=True,
        )
        ci_id = call(pynvml.nvmlComputeInstanceGetInfo, ci).id
        return MigInstance(
            gi_id=info.id,
            profile_id=info.profileId,
            start=info.placement.start,
            size=info.placement.size,
            ci_id=ci_id,
            mig_uuid=self._mig_uuids(h).get((info.id, ci_id)),
        )

    def _full_ci_profile(self, gi: Any, slices: int) -> int:
        for profile in CI_PROFILES:
            try:
                info = call(
                    pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                    gi,
                    profile,
                    pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
            except NvmlError as exc:
                if code_of(exc) in _SKIP:
                    continue
                raise
            if info.sliceCount == slices:
                return profile
        raise nvml_error(NvmlReturn.NOT_SUPPORTED, f"no {slices}-slice CI profile", device=True)

    def destroy_mig(self, uuid: str, gi_id: int) -> None:
        h = self._handle(uuid)
        try:
            gi = call(pynvml.nvmlDeviceGetGpuInstanceById, h, gi_id, device=True)
        except NvmlError as exc:
            if exc.code in (NvmlReturn.NOT_FOUND, NvmlReturn.INVALID_ARGUMENT):
                log.info("GI %d on %s is already gone", gi_id, uuid)
                return
            if exc.code == NvmlReturn.NOT_SUPPORTED:  # MIG off (or no MIG): no GIs exist
                log.info("GI %d on %s: MIG is not enabled, nothing to destroy", gi_id, uuid)
                return
            raise
        for ci in self._ci_handles(gi):
            call(pynvml.nvmlComputeInstanceDestroy, ci, device=True)
        call(pynvml.nvmlGpuInstanceDestroy, gi, device=True)

    def watch_events(self, uuids: Sequence[str]) -> PynvmlEventWatcher:
        return PynvmlEventWatcher(self._handle, list(uuids))

    def compute_mode(self, uuid: str) -> int:
        return int(call(pynvml.nvmlDeviceGetComputeMode, self._handle(uuid)))

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        call(pynvml.nvmlDeviceSetComputeMode, self._handle(uuid), mode, device=True)

    def running_processes(self, uuid: str) -> list[int]:
        h = self._handle(uuid)
        pids: set[int] = set()
        for query in (
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            pids |= {int(p.pid) for p in call(query, h)}
        return sorted(pids)

    def process_utilization(self, uuid: str) -> list[ProcessUtilization]:
        return process_utilization(self._handle(uuid))

    def condition(self, uuid: str) -> GpuCondition:
        return read_condition(self._handle(uuid))

    def utilization(self, uuid: str) -> int:
        return gpu_utilization(self._handle(uuid))

    def mig_sample(self, uuid: str, gi_id: int) -> PynvmlGpmSample:
        return mig_sample(self._handle(uuid), gi_id)

    def mig_utilization(self, first: GpmSample, second: GpmSample) -> float:
        return sm_utilization(first, second)
