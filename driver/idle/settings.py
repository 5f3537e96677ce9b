"""The node plugin's idle-detection settings.

Why node settings: "low" is one fact per device that every
DeviceLeasePolicy reads, measured against one threshold and one window per
node; a policy's ``idle.utilizationBelowPercent`` holds when the node's
threshold is at or below it, and its ``idle.for`` is counted by the
controller from when the device went low (docs/leases.md, "The policy's
threshold and the node's"). One name per
setting across flag, env var and Helm value (``driver.settingsflags``):
``--idle-sample-interval`` / ``IDLE_SAMPLE_INTERVAL`` /
``kubeletPlugin.idleSampleInterval``, and so on (docs/leases.md).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class IdleSettings(BaseModel):
    idle_sample_interval: float = Field(
        default=30.0,
        ge=0,
        description="seconds between utilization samples of the prepared GPUs and MIG "
        "devices (NVML); 0: no sampling, no Idle conditions",
    )
    idle_threshold: float = Field(
        default=5.0,
        gt=0,
        le=100,
        description="percent: a device whose utilization stays below it for --idle-window "
        "seconds gets the condition Idle=True on its claim",
    )
    idle_window: float = Field(
        default=1800.0,
        gt=0,
        description="seconds a device must stay below --idle-threshold to be idle",
    )
