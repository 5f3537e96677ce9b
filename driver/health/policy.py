"""What the plugin does about a failed GPU, per failure class: the settings.

Why: how hard to react to a GPU failure is an operator's trade-off, not a
constant. Each failure class (:mod:`driver.health.classes`) gets the effect
of the device taint the plugin publishes, and the reset class whether the
plugin resets the GPU itself. One name per setting across flag, env var and
Helm value (``driver.settingsflags``): ``--reset-class-taint`` /
``RESET_CLASS_TAINT`` / ``kubeletPlugin.resetClassTaint``, and so on.

Production defaults and why (docs/health.md says the same):

- reset class: ``NoExecute`` and ``gpu_reset`` on. The GPU cannot be reset
  while a pod uses it, and a pod on it computes on hardware that reported a
  fault; so its pods are evicted, the GPU is reset, checked and given back.
  The device-taint eviction of kube-controller-manager deletes pods directly
  (not through the Eviction API): PodDisruptionBudgets are not consulted. A
  workload that cannot lose a pod this way runs on a policy of NoSchedule
  and is drained by its operator; then the reset waits for it.
- reboot class: ``NoSchedule``. The plugin never reboots a node; the
  operator drains it (``kubectl drain`` honours PDBs) and reboots.
- replace class: ``NoExecute``. The GPU fell off the bus, ran out of spare
  rows or lost its NVLink: the pods on it fail or compute on bad memory
  anyway, and no reset brings it back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from driver.health.classes import FailureClass

Effect = Literal["NoSchedule", "NoExecute"]


class HealthSettings(BaseModel):
    reset_class_taint: Effect = Field(
        default="NoExecute",
        description="effect of the taint on a GPU (and its MIG devices) whose failure a GPU "
        "reset cures: NoExecute evicts its pods (deleted directly, PodDisruptionBudgets are "
        "not consulted), NoSchedule leaves them running",
    )
    reboot_class_taint: Effect = Field(
        default="NoSchedule",
        description="effect of the taint on a GPU whose failure needs the node rebooted "
        "(the plugin never reboots; the operator drains and reboots)",
    )
    replace_class_taint: Effect = Field(
        default="NoExecute",
        description="effect of the taint on a GPU that must be replaced (fell off the bus, "
        "failed row remap, fatal NVLink error)",
    )
    gpu_reset: bool = Field(
        default=True,
        description="reset a GPU whose failure a reset cures (nvidia-smi --gpu-reset) once "
        "no prepared claim uses it, check it and publish it healthy again; off: it stays "
        "tainted until the node reboots or the operator resets it",
    )
    gpu_reset_limit: int = Field(
        default=3,
        ge=1,
        description="at most this many resets of one GPU within --gpu-reset-window; a GPU "
        "that needs more stays tainted",
    )
    gpu_reset_window: float = Field(
        default=86400.0, gt=0, description="seconds over which --gpu-reset-limit counts"
    )
    gpu_health_settle: float = Field(
        default=60.0,
        ge=0,
        description="seconds a reset GPU must go without a new critical XID (and pass the "
        "NVML check) before it is published healthy",
    )

    def taint_effect(self, cls: FailureClass) -> Effect:
        if cls is FailureClass.REBOOT:
            return self.reboot_class_taint
        if cls is FailureClass.REPLACE:
            return self.replace_class_taint
        return self.reset_class_taint

    def may_reset(self, cls: FailureClass) -> bool:
        """Whether the plugin resets a GPU of class ``cls`` itself."""
        return self.gpu_reset and cls is FailureClass.RESET
