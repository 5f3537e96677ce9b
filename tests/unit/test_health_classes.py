"""Failure classes: NVML's recovery action first, the XID table where the
field is unsupported, hardware-gone evidence above both."""

from __future__ import annotations

import pytest

from driver.health.classes import FailureClass, class_of_xid, classify, worst
from driver.nvml.condition import GpuCondition, RecoveryAction

UNSUPPORTED = GpuCondition(recovery_action=None)


@pytest.mark.parametrize(
    ("xid", "cls"),
    [
        (13, FailureClass.APPLICATION),  # graphics engine exception
        (31, FailureClass.APPLICATION),  # page fault
        (48, FailureClass.RESET),  # double-bit ECC
        (63, FailureClass.RESET),  # row marked for remapping: applied at reset
        (95, FailureClass.RESET),  # uncontained ECC
        (154, FailureClass.REBOOT),
        (64, FailureClass.REPLACE),  # row remap failed
        (74, FailureClass.REPLACE),  # NVLink fatal
        (79, FailureClass.REPLACE),  # fell off the bus
        (9999, FailureClass.RESET),  # unknown: a reset and a check find out
    ],
)
def test_xid_table_decides_where_the_field_is_unsupported(xid: int, cls: FailureClass) -> None:
    assert class_of_xid(xid) is cls
    assert classify(xid, UNSUPPORTED) is cls
    assert classify(xid, None) is cls  # condition unreadable (lost GPU)


@pytest.mark.parametrize(
    ("action", "cls"),
    [
        (RecoveryAction.NONE, FailureClass.APPLICATION),
        (RecoveryAction.GPU_RESET, FailureClass.RESET),
        (RecoveryAction.DRAIN_AND_RESET, FailureClass.RESET),
        (RecoveryAction.DRAIN_P2P, FailureClass.RESET),
        (RecoveryAction.NODE_REBOOT, FailureClass.REBOOT),
    ],
)
def test_the_recovery_action_overrides_the_table(action: int, cls: FailureClass) -> None:
    # XID 48 is reset-class by the table; the field has the last word.
    assert classify(48, GpuCondition(recovery_action=action)) is cls


def test_hardware_gone_is_replace_whatever_the_action_says() -> None:
    reset = GpuCondition(recovery_action=RecoveryAction.GPU_RESET)
    assert classify(79, reset) is FailureClass.REPLACE
    assert classify(48, GpuCondition(RecoveryAction.GPU_RESET, row_remap_failure=True)) is (
        FailureClass.REPLACE
    )


def test_no_action_yet_pending_memory_repair_is_reset_class() -> None:
    assert classify(94, GpuCondition(RecoveryAction.NONE, row_remap_pending=True)) is (
        FailureClass.RESET
    )
    assert classify(94, GpuCondition(RecoveryAction.NONE, ecc_uncorrected=1)) is FailureClass.RESET


def test_an_action_newer_than_this_build_falls_back_to_the_table() -> None:
    assert classify(79, GpuCondition(recovery_action=42)) is FailureClass.REPLACE
    assert classify(13, GpuCondition(recovery_action=42)) is FailureClass.APPLICATION


def test_worst_is_by_severity() -> None:
    assert worst(FailureClass.RESET, FailureClass.REPLACE) is FailureClass.REPLACE
    assert worst(FailureClass.REBOOT, FailureClass.RESET) is FailureClass.REBOOT
