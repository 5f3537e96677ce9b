"""Raw pynvml calls against the C mock, below the backend layer.

Run as ``python -m tests.contract.abi_probe`` in a subprocess whose
``LD_LIBRARY_PATH`` points at the mock and whose state holds
``tests.contract.scenarios.GPUS``. It checks the entry points and ABI
details the backend does not exercise: versioned structs, lookups by PCI id
and serial, MIG device handles, compute-instance placements, event types.
"""

from __future__ import annotations

import ctypes
import sys

import pynvml as n

from tests.contract.scenarios import A100, H100, L40S


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def expect(code: int, fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except n.NVMLError as exc:
        assert exc.value == code, f"{fn}: expected {code}, got {exc.value}"
        return
    raise AssertionError(f"{fn} did not fail with {code}")


def gpm(h: object, gi_id: int) -> None:
    """GPM of a MIG GPU instance: versioned structs, per-metric answers, samples."""
    support = n.c_nvmlGpmSupport_t()
    support.version = 2
    fn = n._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    assert fn(h, ctypes.byref(support)) == n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    a100 = n.nvmlDeviceGetHandleByUUID(A100.uuid)
    assert n.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    one, two = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
    m = n.c_nvmlGpmMetricsGet_t()
    m.version, m.numMetrics, m.sample1, m.sample2 = 1, 1, one, two
    m.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
    expect(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlGpmMetricsGet, m)  # samples never taken
    n.nvmlGpmMigSampleGet(h, gi_id, one)
    n.nvmlGpmMigSampleGet(h, gi_id, two)
    ids = (n.NVML_GPM_METRIC_GRAPHICS_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY,
           n.NVML_GPM_METRIC_DRAM_BW_UTIL)  # fmt: skip
    m.numMetrics = len(ids)
    for i, metric in enumerate(ids):
        m.metrics[i].metricId = metric
    n.nvmlGpmMetricsGet(m)
    got = [(m.metrics[i].nvmlReturn, m.metrics[i].value) for i in range(len(ids))]
    assert got == [(0, 0.0), (0, 0.0), (n.NVML_ERROR_NOT_SUPPORTED, 0.0)], got
    assert text(m.metrics[0].metricInfo.unit) == "%"
    m.version = 2
    expect(n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, n.nvmlGpmMetricsGet, m)
    expect(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlGpmMigSampleGet, a100, 1, one)
    n.nvmlGpmSampleFree(one)
    n.nvmlGpmSampleFree(two)


def main() -> int:
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByUUID(H100.uuid)
    assert n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByPciBusId("00000000:3B:00.0")) == H100.uuid
    assert n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByPciBusId("0000:3b:00.0")) == H100.uuid
    assert n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleBySerial(A100.serial)) == A100.uuid
    expect(n.NVML_ERROR_NOT_FOUND, n.nvmlDeviceGetHandleByUUID, "GPU-nope")
    expect(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlDeviceGetHandleByIndex, 99)
    pci = n.nvmlDeviceGetPciInfo_v3(h)
    assert (pci.domain, pci.bus, pci.device, pci.pciDeviceId) == (0, 0x3B, 0, 0x233010DE)
    assert (text(pci.busIdLegacy), text(pci.busId)) == ("0000:3B:00.0", "00000000:3B:00.0")

    # versioned structs: a wrong version is refused, not misread
    mem = n.c_nvmlMemory_v2_t()
    mem.version = 0x01000028
    fn = n._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
    assert fn(h, ctypes.byref(mem)) == n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    info = n.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0
    fn = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert fn(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE, ctypes.byref(info)) == 25
    v2 = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (v2.id, text(v2.name), v2.memorySizeMB, v2.sliceCount) == (9, "MIG 3g.40gb", 40448, 3)
    expect(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlDeviceGetGpuInstanceProfileInfo, h, 0x40)
    expect(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceGetGpuInstanceProfileInfo, h, 5)  # 8-slice
    lh = n.nvmlDeviceGetHandleByUUID(L40S.uuid)
    expect(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceGetMigMode, lh)
    assert n.nvmlDeviceGetMaxMigDeviceCount(lh) == 0

    # placements: count query, too-small buffer, content
    count = ctypes.c_uint(0)
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, None, ctypes.byref(count))
    assert count.value == 7
    small = (n.c_nvmlGpuInstancePlacement_t * 2)()
    count.value = 2
    expect(
        n.NVML_ERROR_INSUFFICIENT_SIZE,
        n.nvmlDeviceGetGpuInstancePossiblePlacements,
        h,
        19,
        small,
        ctypes.byref(count),
    )

    # MIG: GI at a placement, CI inside, MIG device handle
    n.nvmlDeviceSetMigMode(h, n.NVML_DEVICE_MIG_ENABLE)
    assert n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 2
    place = n.c_nvmlGpuInstancePlacement_t(4, 4)
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(place))
    assert n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    gi_info = n.nvmlGpuInstanceGetInfo(gi)
    assert (gi_info.profileId, gi_info.placement.start, gi_info.placement.size) == (9, 4, 4)
    ci_profile = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 1, 0)  # 2 of 3 slices
    assert (ci_profile.sliceCount, text(ci_profile.name)) == (2, "MIG 2c.3g.40gb")
    assert n.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 3
    expect(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlGpuInstanceCreateComputeInstance, gi, 4)  # 7 > 3
    ci = n.nvmlGpuInstanceCreateComputeInstance(gi, 2)
    expect(n.NVML_ERROR_INSUFFICIENT_RESOURCES, n.nvmlGpuInstanceCreateComputeInstance, gi, 0)
    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    expect(n.NVML_ERROR_NOT_FOUND, n.nvmlDeviceGetMigDeviceHandleByIndex, h, 1)
    assert n.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert n.nvmlDeviceIsMigDeviceHandle(h).value == 0
    parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert n.nvmlDeviceGetUUID(parent) == H100.uuid
    assert n.nvmlDeviceGetGpuInstanceId(mig) == gi_info.id
    assert n.nvmlDeviceGetComputeInstanceId(mig) == n.nvmlComputeInstanceGetInfo(ci).id
    assert n.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert n.nvmlDeviceGetMemoryInfo(mig).total == 40448 << 20
    assert n.nvmlDeviceGetAttributes(mig).multiprocessorCount == 60
    mig_uuid = n.nvmlDeviceGetUUID(mig)
    assert n.nvmlDeviceGetGpuInstanceId(n.nvmlDeviceGetHandleByUUID(mig_uuid)) == gi_info.id
    expect(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceGetSerial, mig)
    gpm(h, gi_info.id)
    expect(n.NVML_ERROR_IN_USE, n.nvmlGpuInstanceDestroy, gi)
    n.nvmlComputeInstanceDestroy(ci)
    expect(n.NVML_ERROR_INVALID_ARGUMENT, n.nvmlDeviceGetUUID, mig)  # stale MIG handle
    n.nvmlGpuInstanceDestroy(gi)
    expect(n.NVML_ERROR_NOT_FOUND, n.nvmlDeviceGetGpuInstanceById, h, gi_info.id)

    # events: the types a GPU supports, registration of others refused
    assert n.nvmlDeviceGetSupportedEventTypes(h) & n.nvmlEventTypeXidCriticalError
    es = n.nvmlEventSetCreate()
    expect(n.NVML_ERROR_NOT_SUPPORTED, n.nvmlDeviceRegisterEvents, h, n.nvmlEventTypeClock, es)
    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
    expect(n.NVML_ERROR_TIMEOUT, n.nvmlEventSetWait_v2, es, 10)
    n.nvmlEventSetFree(es)
    n.nvmlShutdown()
    expect(n.NVML_ERROR_UNINITIALIZED, n.nvmlDeviceGetCount)
    return 0


if __name__ == "__main__":
    sys.exit(main())
