"""Failure classes of a GPU: what an XID means for the GPU and who acts.

Why: one XID is a program's bug, another needs a GPU reset, another a node
reboot, another a new GPU. The plugin's response differs per class (the
taint's effect, whether it resets the GPU itself: :mod:`driver.health.policy`),
so each failure is classed first. The source of truth is NVML's recovery
action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, R555+ drivers) read right
after the XID; where the driver does not support the field, the XID table
below decides (NVIDIA's XID catalog, "Resolution Bucket (Immediate Action)":
RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT). Evidence that the
hardware itself is gone (fell off the bus, a row remap that failed for want
of spare rows, a fatal NVLink error) makes a GPU REPLACE whatever the
recovery action says: no reset brings spare rows back.
"""

from __future__ import annotations

import enum

from driver.nvml.condition import GpuCondition, RecoveryAction


class FailureClass(enum.Enum):
    """Ordered by severity: a GPU's class is the worst of its failures."""

    APPLICATION = "application"  # a program's fault: the GPU stays healthy
    RESET = "reset"  # a GPU reset cures it
    REBOOT = "reboot"  # the node must reboot: reported, never acted on
    REPLACE = "replace"  # the GPU must be replaced

    @property
    def rank(self) -> int:
        return list(FailureClass).index(self)


def worst(a: FailureClass, b: FailureClass) -> FailureClass:
    return a if a.rank >= b.rank else b


# Application-level XIDs (RESTART_APP: graphics engine exception, page fault,
# GPU stopped processing a channel, preemptive cleanup, NVDEC exception,
# context switch timeout): the GPU itself is fine.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# RESET_GPU: double-bit ECC (48), internal micro-controller halt (62), a row
# marked for remapping (63: takes effect at reset), high single-bit ECC rate
# (92), contained (94) and uncontained (95) ECC errors, GSP RPC timeout and
# GSP error (119, 120), unrecovered ECC (140).
RESET_XIDS = frozenset({48, 62, 63, 92, 94, 95, 119, 120, 140})
# Needs the node rebooted (RESTART_BM): the driver's recovery-action-changed
# XID (154) when no field tells more.
REBOOT_XIDS = frozenset({154})
# The hardware is gone: row remap or page retirement failed (64), fatal
# NVLink error (74), fell off the bus (79).
REPLACE_XIDS = frozenset({64, 74, 79})

_BY_ACTION = {
    RecoveryAction.NONE: FailureClass.APPLICATION,
    RecoveryAction.GPU_RESET: FailureClass.RESET,
    RecoveryAction.DRAIN_P2P: FailureClass.RESET,
    RecoveryAction.DRAIN_AND_RESET: FailureClass.RESET,
    RecoveryAction.NODE_REBOOT: FailureClass.REBOOT,
    RecoveryAction.RECOVER_IMEX_DOMAIN: FailureClass.REBOOT,
    RecoveryAction.BUS_RESET: FailureClass.REBOOT,
    RecoveryAction.SYSTEM_REBOOT: FailureClass.REBOOT,
}


def class_of_xid(xid: int) -> FailureClass:
    """The XID table's class; an XID it does not list is RESET (a reset and
    the health check after it are the safe way to find out more)."""
    if xid in APPLICATION_XIDS:
        return FailureClass.APPLICATION
    if xid in REPLACE_XIDS:
        return FailureClass.REPLACE
    if xid in REBOOT_XIDS:
        return FailureClass.REBOOT
    return FailureClass.RESET


def classify(xid: int, condition: GpuCondition | None) -> FailureClass:
    """The class of ``xid`` given the GPU's condition read after it (None:
    unreadable, e.g. the GPU is lost: the XID table alone decides)."""
    by_table = class_of_xid(xid)
    if condition is None:
        return by_table
    if condition.row_remap_failure or by_table is FailureClass.REPLACE:
        return FailureClass.REPLACE
    action = condition.recovery_action
    if action is None:
        return by_table
    try:
        by_action = _BY_ACTION[RecoveryAction(action)]
    except ValueError:  # an action newer than this build: the table decides
        return by_table
    if by_action is FailureClass.APPLICATION and (
        condition.row_remap_pending or condition.ecc_uncorrected
    ):
        return FailureClass.RESET  # no action asked, yet the memory needs a reset
    return by_action
