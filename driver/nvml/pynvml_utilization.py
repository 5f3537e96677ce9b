"""How busy a GPU or a MIG device is, through pynvml.

Why a module of its own: a whole GPU answers ``nvmlDeviceGetUtilizationRates``
(NOT_SUPPORTED while MIG is on), a MIG device only GPM (GPU Performance
Monitoring, Hopper and newer): two samples of its GPU instance, each a buffer
NVML allocates and we must free, and a metrics call between them that
answers per metric. :mod:`driver.nvml.pynvml_backend` is at its size limit.
"""

from __future__ import annotations

from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.backend import GpmSample, NvmlReturn, ProcessUtilization, nvml_error
from driver.nvml.pynvml_library import call


def gpu_utilization(h: Any) -> int:
    """The GPU's utilization rate, percent."""
    return int(call(pynvml.nvmlDeviceGetUtilizationRates, h).gpu)


def process_utilization(h: Any) -> list[ProcessUtilization]:
    """Every per-process sample NVML holds for the GPU; NOT_FOUND (no sample) is none."""
    try:
        raw = call(pynvml.nvmlDeviceGetProcessUtilization, h, 0)
    except NvmlError as exc:
        if exc.code == NvmlReturn.NOT_FOUND:
            return []
        raise
    return [ProcessUtilization(int(s.pid), int(s.smUtil), int(s.memUtil), int(s.timeStamp))
            for s in raw]  # fmt: skip


class PynvmlGpmSample:
    """A GPM sample buffer, freed by :meth:`close`."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def close(self) -> None:
        raw, self.raw = self.raw, None
        if raw is not None:
            call(pynvml.nvmlGpmSampleFree, raw)


def mig_sample(h: Any, gi_id: int) -> PynvmlGpmSample:
    """A GPM sample of GPU instance ``gi_id`` of the GPU behind ``h``."""
    if not call(pynvml.nvmlGpmQueryDeviceSupport, h).isSupportedDevice:
        raise nvml_error(NvmlReturn.NOT_SUPPORTED, "GPM is not supported on this GPU")
    sample = PynvmlGpmSample(call(pynvml.nvmlGpmSampleAlloc))
    try:
        call(pynvml.nvmlGpmMigSampleGet, h, gi_id, sample.raw)
    except BaseException:
        sample.close()
        raise
    return sample


def sm_utilization(first: GpmSample, second: GpmSample) -> float:
    """SM utilization, percent, between two samples of one GPU instance."""
    if not isinstance(first, PynvmlGpmSample) or not isinstance(second, PynvmlGpmSample):
        raise nvml_error(NvmlReturn.INVALID_ARGUMENT, "not GPM samples of pynvml")
    if first.raw is None or second.raw is None:
        raise nvml_error(NvmlReturn.INVALID_ARGUMENT, "a GPM sample was freed")
    m = pynvml.c_nvmlGpmMetricsGet_t()
    m.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    m.numMetrics = 1
    m.sample1, m.sample2 = first.raw, second.raw
    m.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    call(pynvml.nvmlGpmMetricsGet, m)
    metric = m.metrics[0]
    if metric.nvmlReturn != pynvml.NVML_SUCCESS:
        raise nvml_error(int(metric.nvmlReturn), "GPM SM utilization")
    return float(metric.value)
