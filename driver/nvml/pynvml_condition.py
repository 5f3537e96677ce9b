"""Reading a GPU's condition (:class:`driver.nvml.condition.GpuCondition`)
through pynvml.

Why a module of its own: the three queries each have their own way of
saying "not supported" (a per-value return in ``nvmlDeviceGetFieldValues``,
NOT_SUPPORTED from the others) and none of them may fail the reading as a
whole; :mod:`driver.nvml.pynvml_backend` is already at its size limit.
"""

from __future__ import annotations

from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.backend import NvmlReturn
from driver.nvml.condition import FI_GPU_RECOVERY_ACTION, GpuCondition
from driver.nvml.pynvml_library import call

_UNSUPPORTED = {NvmlReturn.NOT_SUPPORTED, NvmlReturn.INVALID_ARGUMENT}


def _recovery_action(h: Any) -> int | None:
    values = call(pynvml.nvmlDeviceGetFieldValues, h, [FI_GPU_RECOVERY_ACTION])
    value = values[0]
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    return int(value.value.uiVal)


def read_condition(h: Any) -> GpuCondition:
    """The condition of the GPU behind handle ``h`` (lost GPU: the NVML error)."""
    try:
        action = _recovery_action(h)
    except NvmlError as exc:
        if exc.code not in _UNSUPPORTED:
            raise
        action = None
    pending = failure = False
    try:
        _, _, p, f = call(pynvml.nvmlDeviceGetRemappedRows, h)
        pending, failure = bool(p), bool(f)
    except NvmlError as exc:
        if exc.code not in _UNSUPPORTED:
            raise
    ecc: int | None
    try:
        ecc = int(
            call(
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
        )
    except NvmlError as exc:
        if exc.code not in _UNSUPPORTED:
            raise
        ecc = None
    return GpuCondition(action, pending, failure, ecc)
