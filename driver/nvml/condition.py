"""What NVML says of a GPU's condition after a failure, backend-neutral.

Why: deciding what an XID means (an application's fault, a GPU reset cures
it, the node must reboot, the GPU must be replaced) and whether a reset
cured it needs more than the XID number. NVML reports the recovery the
driver wants (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, R555+), the row
remapper's state and the uncorrectable ECC count since the last reset. The
backends (:mod:`driver.nvml.fake`, :mod:`driver.nvml.pynvml_condition`)
return these values; :mod:`driver.health.classes` interprets them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# NVML's field id (nvml.h; pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
FI_GPU_RECOVERY_ACTION = 230


class RecoveryAction(enum.IntEnum):
    """``nvmlDeviceGpuRecoveryAction_t``."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


@dataclass(frozen=True)
class GpuCondition:
    """One reading of a GPU's condition.

    ``recovery_action`` is None where the driver does not support the field
    (older drivers): then the XID table decides. ``ecc_uncorrected`` is the
    volatile count (since the last reset); None where ECC is not supported.
    """

    recovery_action: int | None = RecoveryAction.NONE
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    ecc_uncorrected: int | None = 0

    def problems(self) -> list[str]:
        """Why this reading fails a post-reset health check (empty: it passes)."""
        out = []
        if self.recovery_action not in (None, RecoveryAction.NONE):
            out.append(f"recovery action {action_name(self.recovery_action)}")
        if self.row_remap_pending:
            out.append("row remap pending")
        if self.row_remap_failure:
            out.append("row remap failed")
        if self.ecc_uncorrected:
            out.append(f"{self.ecc_uncorrected} uncorrectable ECC error(s)")
        return out


def action_name(value: int | None) -> str:
    if value is None:
        return "unsupported"
    try:
        return RecoveryAction(value).name.lower()
    except ValueError:
        return str(value)
