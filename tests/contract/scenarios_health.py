"""Contract scenarios of what a GPU's processes and condition look like to NVML.

Why apart from ``tests.contract.scenarios``: the same contract (the fake
and the C mock must both answer so), for what the health and fabric code
read off a GPU: which processes hold it, its recovery action, row remapper
and uncorrectable ECC count, and what a reset and an XID change of them.
"""

from __future__ import annotations

from driver.nvml.condition import GpuCondition, RecoveryAction
from tests.contract.scenarios import A100, A100_80, H100, H200, L40S, make_mig, raises, started
from tests.contract.world import World


def running_processes(world: World) -> None:
    """Processes per GPU, seen live by a started process; they survive a MIG
    change written back by the library; a lost GPU answers GPU_IS_LOST."""
    b = started(world)
    assert b.running_processes(H100.uuid) == []
    world.set_processes(H100.uuid, [4242, 17])
    assert b.running_processes(H100.uuid) == [17, 4242]
    assert b.running_processes(H200.uuid) == []  # one GPU's processes, not the node's
    b.set_mig_mode(H200.uuid, True)
    make_mig(b, H200.uuid, 9, 0)  # the library writes the state back
    assert world.other_process("running_processes", H100.uuid) == [17, 4242]
    world.set_processes(H100.uuid, [])
    assert b.running_processes(H100.uuid) == []
    world.set_lost(H100.uuid)
    raises("GPU_IS_LOST", b.running_processes, H100.uuid)
    b.shutdown()


def condition(world: World) -> None:
    """The recovery action, row remapper and volatile uncorrectable ECC count,
    seen live; a field the driver does not support reads None; a reset clears
    all but a failed remap and takes MIG instances with it."""
    b = started(world)
    assert b.condition(H100.uuid) == GpuCondition(RecoveryAction.NONE, False, False, 0)
    world.set_condition(H100.uuid, recovery_action=RecoveryAction.GPU_RESET,
                        row_remap_pending=True, ecc_uncorrected=3)  # fmt: skip
    got = b.condition(H100.uuid)
    assert got == GpuCondition(RecoveryAction.GPU_RESET, True, False, 3)
    assert got.problems() == [
        "recovery action gpu_reset",
        "row remap pending",
        "3 uncorrectable ECC error(s)",
    ]
    assert b.condition(H200.uuid).problems() == []  # one GPU's condition, not the node's
    b.set_mig_mode(H100.uuid, True)
    make_mig(b, H100.uuid, 9, 0)
    world.reset_gpu(H100.uuid)
    assert b.condition(H100.uuid) == GpuCondition(RecoveryAction.NONE, False, False, 0)
    assert b.mig_instances(H100.uuid) == []  # a reset destroys MIG instances
    world.set_condition(H200.uuid, recovery_action=None, row_remap_failure=True)
    world.reset_gpu(H200.uuid)
    assert b.condition(H200.uuid) == GpuCondition(None, False, True, 0)  # failure stays
    assert b.condition(H200.uuid).problems() == ["row remap failed"]
    # An XID comes with what the driver records with it.
    world.queue_xid(H100.uuid, 48)  # double-bit ECC: reset, one uncorrectable error
    assert b.condition(H100.uuid) == GpuCondition(RecoveryAction.GPU_RESET, False, False, 1)
    world.queue_xid(A100.uuid, 63)  # a row to remap at the next reset
    assert b.condition(A100.uuid) == GpuCondition(RecoveryAction.GPU_RESET, True, False, 0)
    world.queue_xid(L40S.uuid, 154)
    assert b.condition(L40S.uuid).recovery_action == RecoveryAction.NODE_REBOOT
    world.queue_xid(H200.uuid, 48)  # the field unsupported: it stays so
    assert b.condition(H200.uuid) == GpuCondition(None, False, True, 1)
    world.queue_xid(A100_80.uuid, 31)  # an application's page fault: nothing recorded
    assert b.condition(A100_80.uuid) == GpuCondition(RecoveryAction.NONE, False, False, 0)
    world.set_lost(H100.uuid)
    raises("GPU_IS_LOST", b.condition, H100.uuid)
    b.shutdown()
