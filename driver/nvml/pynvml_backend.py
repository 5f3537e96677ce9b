"""The real NVML backend: ``pynvml`` over ``libnvidia-ml.so.1``.

This is the only module that imports ``pynvml``. Every call blocks; the
plugin runs them in a worker thread. pynvml loads the library by soname
(``CDLL("libnvidia-ml.so.1")``); to use another build (our C mock) either set
``LD_LIBRARY_PATH`` before the process starts, or set
``PATCHBAY_NVML_LIBRARY`` to the library's absolute path, or pass
``driver_root`` (the plugin's ``--driver-root``; the library is looked up
below it, ``driver.nvml.library``, on every ``init`` until it is loaded, so a
driver installed later is picked up): we load that file first, and the
dynamic loader then resolves pynvml's soname lookup to the already loaded
object. The environment variable (a test hook) wins.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.backend import (
    ARCHITECTURES,
    BRANDS,
    XID_FALLEN_OFF_BUS,
    GpuInfo,
    MigInstance,
    MigProfile,
    NvmlReturn,
    SystemInfo,
    XidEvent,
    counts_errors,
    cuda_version,
    normalize_bus_id,
    nvml_error,
    short_profile_name,
)
from driver.nvml.library import find_library, not_found_message

log = logging.getLogger(__name__)

LIBRARY_ENV = "PATCHBAY_NVML_LIBRARY"
_preloaded: list[ctypes.CDLL] = []


def _preload_library(driver_root: Path | None = None) -> None:
    """Load the library by absolute path once it is there (looked up again on
    every call until then: a driver installed later is found)."""
    if _preloaded:
        return
    found = find_library(driver_root) if driver_root is not None else None
    path = os.environ.get(LIBRARY_ENV) or (str(found) if found else "")
    if not path:
        return  # pynvml tries the soname through the dynamic loader
    try:
        _preloaded.append(ctypes.CDLL(str(Path(path).resolve())))
    except OSError as exc:
        raise nvml_error(NvmlReturn.LIBRARY_NOT_FOUND, f"cannot load {path}: {exc}") from exc
    log.info("NVML library preloaded from %s", path)


def call(fn: Callable[..., Any], *args: Any, device: bool = False) -> Any:
    """Run a pynvml function, turning NVMLError into our NvmlError."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise nvml_error(int(exc.value), str(exc), device=device) from exc


def code_of(exc: NvmlError) -> NvmlReturn | None:
    try:
        return NvmlReturn(exc.code)
    except ValueError:
        return None


GI_PROFILES = range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
CI_PROFILES = range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
_SKIP = {NvmlReturn.NOT_SUPPORTED, NvmlReturn.INVALID_ARGUMENT}


@counts_errors
class PynvmlBackend:
    """:class:`driver.nvml.backend.NvmlBackend` over the real pynvml."""

    def __init__(self, driver_root: Path | None = None) -> None:
        self._driver_root = driver_root

    def init(self) -> None:
        _preload_library(self._driver_root)
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
        return PynvmlEventWatcher(self, list(uuids))

    def compute_mode(self, uuid: str) -> int:
        return int(call(pynvml.nvmlDeviceGetComputeMode, self._handle(uuid)))

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        call(pynvml.nvmlDeviceSetComputeMode, self._handle(uuid), mode, device=True)


@counts_errors
class PynvmlEventWatcher:
    """XID events through an NVML event set.

    A watched GPU that is lost makes NVML's wait fail with GPU_IS_LOST; we
    report it once as XID 79 (fallen off the bus) and rebuild the event set
    without it, so the other GPUs stay watched.
    """

    def __init__(self, backend: PynvmlBackend, uuids: list[str]) -> None:
        self._backend = backend
        self._uuids = uuids
        self._set: Any = None
        self._build()

    def _build(self) -> None:
        if self._set is not None:
            call(pynvml.nvmlEventSetFree, self._set)
        self._set = call(pynvml.nvmlEventSetCreate)
        for uuid in self._uuids:
            h = self._backend._handle(uuid)
            call(
                pynvml.nvmlDeviceRegisterEvents, h, pynvml.nvmlEventTypeXidCriticalError, self._set
            )

    def _lost(self) -> list[XidEvent]:
        lost = []
        for uuid in self._uuids:
            try:
                call(pynvml.nvmlDeviceGetUUID, self._backend._handle(uuid))
            except NvmlError as exc:
                if exc.code != NvmlReturn.GPU_IS_LOST:
                    raise
                lost.append(XidEvent(uuid, XID_FALLEN_OFF_BUS))
        gone = {e.uuid for e in lost}
        self._uuids = [u for u in self._uuids if u not in gone]
        self._build()
        return lost

    def wait(self, timeout_ms: int) -> list[XidEvent]:
        events: list[XidEvent] = []
        while True:
            try:
                data = call(pynvml.nvmlEventSetWait_v2, self._set, 0 if events else timeout_ms)
            except NvmlError as exc:
                if exc.code == NvmlReturn.TIMEOUT:
                    return events
                if exc.code == NvmlReturn.GPU_IS_LOST:
                    return events + self._lost()
                raise
            uuid = call(pynvml.nvmlDeviceGetUUID, data.device)
            events.append(XidEvent(uuid, int(data.eventData)))

    def close(self) -> None:
        if self._set is not None:
            call(pynvml.nvmlEventSetFree, self._set)
            self._set = None
