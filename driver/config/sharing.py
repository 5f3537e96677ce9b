"""``GpuConfig.sharing``: how the consumers of one claim share its GPUs.

The shape follows NVIDIA's DRA driver (``sharing.strategy`` with
``timeSlicingConfig`` or ``mpsConfig``), strict like every opaque config:
unknown fields, a block for another strategy, an unknown interval or a
thread percentage outside 1-100 fail the claim with the field named. What
each strategy does to the GPU lives in ``driver.gpu.sharing``; this module
only decodes and checks.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# nvidia-smi compute-policy --set-timeslice takes these numbers.
TIMESLICE_INTERVALS: dict[str, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def quantity_mib(text: str) -> int:
    """A Kubernetes quantity of bytes ("10Gi", "512M") in whole MiB (at least 1)."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a quantity of bytes such as 10Gi or 512Mi")
    mib = int(match.group(1)) * _UNITS[match.group(2)] // 2**20
    if mib < 1:
        raise ValueError(f"{text!r} is less than 1Mi")
    return mib


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TimeSlicingConfig(_Strict):
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class MpsConfig(_Strict):
    default_active_thread_percentage: int | None = Field(
        default=None, alias="defaultActiveThreadPercentage", ge=1, le=100
    )
    default_pinned_device_memory_limit: str | None = Field(
        default=None, alias="defaultPinnedDeviceMemoryLimit"
    )

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None:
            quantity_mib(value)
        return value

    @property
    def pinned_mib(self) -> int | None:
        limit = self.default_pinned_device_memory_limit
        return None if limit is None else quantity_mib(limit)


class GpuSharing(_Strict):
    strategy: Literal["Exclusive", "TimeSlicing", "MPS"]
    time_slicing: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps: MpsConfig | None = Field(default=None, alias="mpsConfig")

    @model_validator(mode="after")
    def _one_block(self) -> GpuSharing:
        if self.time_slicing is not None and self.strategy != "TimeSlicing":
            raise ValueError(f"timeSlicingConfig is for strategy TimeSlicing, not {self.strategy}")
        if self.mps is not None and self.strategy != "MPS":
            raise ValueError(f"mpsConfig is for strategy MPS, not {self.strategy}")
        return self

    @property
    def timeslice(self) -> int:
        """The ``--set-timeslice`` number of this config's interval."""
        return TIMESLICE_INTERVALS[(self.time_slicing or TimeSlicingConfig()).interval]
