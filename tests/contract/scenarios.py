"""Contract scenarios: the same behaviour demanded of the fake and the C mock.

Each scenario takes a :class:`tests.contract.world.World` whose node starts
with :data:`GPUS` and asserts what NVML semantics require. Facts are spelled
out here (not read from either implementation), so both must match them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from driver.errors import NvmlDeviceError, NvmlError
from driver.nvml.backend import ComputeMode, GpuInfo, MigInstance, NvmlBackend, SystemInfo, XidEvent
from tests.contract.world import SimGpu, World, plain

H100 = SimGpu(
    "GPU-1d0e6c3a-4b2f-4c11-9a7e-000000000001", "H100-SXM5-80GB", "0000:3b:00.0", "1654922000001", 0
)
A100 = SimGpu(
    "GPU-1d0e6c3a-4b2f-4c11-9a7e-000000000002", "A100-SXM4-40GB", "0000:1a:00.0", "1654922000002", 1
)
L40S = SimGpu(
    "GPU-1d0e6c3a-4b2f-4c11-9a7e-000000000003", "L40S", "0000:5e:00.0", "1654922000003", 2
)
H200 = SimGpu(
    "GPU-1d0e6c3a-4b2f-4c11-9a7e-000000000004",
    "H200-SXM5-141GB",
    "0000:86:00.0",
    "1654922000004",
    3,
)
A100_80 = SimGpu(
    "GPU-1d0e6c3a-4b2f-4c11-9a7e-000000000005", "A100-SXM4-80GB", "0000:af:00.0", "1654922000005", 4
)
GPUS = [H100, A100, L40S, H200, A100_80]
NEW = SimGpu(
    "GPU-1d0e6c3a-4b2f-4c11-9a7e-000000000006",
    "H200-SXM5-141GB",
    "0000:c1:00.0",
    "1654922000006",
    5,
)

# model -> (product name, architecture, compute capability, memory MiB, MIG)
FACTS = {
    "H100-SXM5-80GB": ("NVIDIA H100 80GB HBM3", "hopper", "9.0", 81559, True),
    "A100-SXM4-40GB": ("NVIDIA A100-SXM4-40GB", "ampere", "8.0", 40960, True),
    "A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", "ampere", "8.0", 81920, True),
    "H200-SXM5-141GB": ("NVIDIA H200", "hopper", "9.0", 143771, True),
    "L40S": ("NVIDIA L40S", "ada", "8.9", 46068, False),
}

# (profile id, name, compute slices, memory slots, MiB, SMs, media engines, starts, max)
H100_PROFILES = [
    (19, "1g.10gb", 1, 1, 9984, 16, False, [0, 1, 2, 3, 4, 5, 6], 7),
    (20, "1g.10gb+me", 1, 1, 9984, 16, True, [0, 1, 2, 3, 4, 5, 6], 1),
    (15, "1g.20gb", 1, 2, 20096, 26, False, [0, 2, 4, 6], 4),
    (14, "2g.20gb", 2, 2, 20096, 32, False, [0, 2, 4], 3),
    (9, "3g.40gb", 3, 4, 40448, 60, False, [0, 4], 2),
    (5, "4g.40gb", 4, 4, 40448, 64, False, [0], 1),
    (0, "7g.80gb", 7, 8, 81152, 132, True, [0], 1),
]
NAMES = {
    "A100-SXM4-40GB": [
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ],
    "A100-SXM4-80GB": [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ],
    "H200-SXM5-141GB": [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ],
}
MEMORY = {
    "A100-SXM4-40GB": [4864, 4864, 9856, 9856, 19968, 19968, 40192],
    "A100-SXM4-80GB": [9856, 9856, 19968, 19968, 40192, 40192, 80384],
    "H200-SXM5-141GB": [16384, 16384, 33280, 33280, 71424, 71424, 143360],
}


def raises(name: str, fn: Callable[..., Any], *args: Any) -> NvmlError:
    with pytest.raises(NvmlError) as info:
        fn(*args)
    assert info.value.name == name, f"expected {name}, got {info.value}"
    return info.value


def started(world: World) -> NvmlBackend:
    backend = world.backend()
    backend.init()
    return backend


def make_mig(b: NvmlBackend, uuid: str, profile_id: int, start: int) -> MigInstance:
    """A MIG device made as production makes one (``driver.mig.handler``): the GPU
    instance at the placement, then one compute instance using all of it."""
    return b.create_compute_instance(uuid, b.create_gpu_instance(uuid, profile_id, start))


def enumeration(world: World) -> None:
    backend = world.backend()
    raises("UNINITIALIZED", backend.gpus)
    backend.init()
    assert backend.system_info() == SystemInfo("580.82.07", "13.0")
    gpus = backend.gpus()
    expected = sorted(GPUS, key=lambda g: g.bdf)
    assert [g.uuid for g in gpus] == [g.uuid for g in expected]
    for index, (got, sim) in enumerate(zip(gpus, expected, strict=True)):
        name, arch, cc, mib, mig = FACTS[sim.model]
        assert got == GpuInfo(
            index,
            sim.minor,
            sim.uuid,
            sim.serial,
            name,
            "Nvidia",
            arch,
            cc,
            mib << 20,
            sim.bdf,
            mig,
            False,
            False,
        )
    got_h100 = [
        (
            p.profile_id,
            p.name,
            p.compute_slices,
            p.memory_slots,
            p.memory_mib,
            p.multiprocessors,
            p.media_engines,
            [s for s, _ in p.placements],
            p.max_count,
        )
        for p in backend.mig_profiles(H100.uuid)
    ]
    assert got_h100 == H100_PROFILES
    for sim in (A100, A100_80, H200):
        profiles = backend.mig_profiles(sim.uuid)
        assert [p.name for p in profiles] == NAMES[sim.model]
        assert [p.memory_mib for p in profiles] == MEMORY[sim.model]
        assert all(size == p.memory_slots for p in profiles for _, size in p.placements)
    assert backend.mig_profiles(L40S.uuid) == []
    assert backend.mig_instances(L40S.uuid) == []
    assert backend.mig_instances(H100.uuid) == []
    backend.shutdown()
    raises("UNINITIALIZED", backend.gpus)


def mig_cycle(world: World) -> None:
    b = started(world)
    assert b.set_mig_mode(H100.uuid, True) == (True, True)
    big = make_mig(b, H100.uuid, 9, 4)
    assert (big.profile_id, big.start, big.size, big.ci_id) == (9, 4, 4, 0)
    assert big.gi_id >= 1 and big.mig_uuid is not None and big.mig_uuid.startswith("MIG-")
    small = make_mig(b, H100.uuid, 19, 0)
    assert (small.start, small.size) == (0, 1) and small.gi_id != big.gi_id
    assert small.mig_uuid != big.mig_uuid
    assert b.mig_instances(H100.uuid) == [small, big]
    err = raises("IN_USE", b.set_mig_mode, H100.uuid, False)
    assert isinstance(err, NvmlDeviceError)
    b.destroy_mig(H100.uuid, big.gi_id)
    b.destroy_mig(H100.uuid, big.gi_id)  # already gone: fine
    assert b.mig_instances(H100.uuid) == [small]
    b.destroy_mig(H100.uuid, small.gi_id)
    assert b.mig_instances(H100.uuid) == []
    assert b.set_mig_mode(H100.uuid, False) == (False, False)
    raises("NOT_SUPPORTED", b.create_gpu_instance, H100.uuid, 19, 0)
    b.destroy_mig(H100.uuid, small.gi_id)  # MIG off: nothing left to destroy
    b.shutdown()


def two_step_mig(world: World) -> None:
    """The two calls of a MIG prepare, and a crash between them (``mig-gi-created``)."""
    b = started(world)
    b.set_mig_mode(H100.uuid, True)
    gi = b.create_gpu_instance(H100.uuid, 14, 2)  # 2g.20gb at memory slot 2
    (half,) = b.mig_instances(H100.uuid)
    assert (half.gi_id, half.profile_id, half.start, half.size) == (gi, 14, 2, 2)
    assert (half.ci_id, half.mig_uuid) == (None, None)  # no compute instance yet: no MIG device
    assert world.other_process("mig_instances", H100.uuid) == [plain(half)]  # a restarted plugin
    mig = b.create_compute_instance(H100.uuid, gi)
    assert (mig.gi_id, mig.profile_id, mig.start, mig.size, mig.ci_id) == (gi, 14, 2, 2, 0)
    assert mig.mig_uuid is not None and mig.mig_uuid.startswith("MIG-")
    assert b.mig_instances(H100.uuid) == [mig]
    raises("INSUFFICIENT_RESOURCES", b.create_compute_instance, H100.uuid, gi)  # one CI fills it
    raises("NOT_FOUND", b.create_compute_instance, H100.uuid, gi + 1)
    # Another process's half-made instance (it crashed after the GI) is destroyed whole.
    orphan = world.other_process("create_gpu_instance", H100.uuid, 19, 0)
    assert [m.gi_id for m in b.mig_instances(H100.uuid)] == [orphan, gi]
    b.destroy_mig(H100.uuid, orphan)
    assert b.mig_instances(H100.uuid) == [mig]
    b.destroy_mig(H100.uuid, gi)
    assert b.mig_instances(H100.uuid) == []
    b.shutdown()


def mode_semantics(world: World) -> None:
    b = started(world)
    assert b.set_mig_mode(A100.uuid, True) == (False, True)  # Ampere: pending until reset
    raises("NOT_SUPPORTED", b.create_gpu_instance, A100.uuid, 9, 0)
    world.reset_gpu(A100.uuid)
    a100 = next(g for g in b.gpus() if g.uuid == A100.uuid)
    assert (a100.mig_mode_current, a100.mig_mode_pending) == (True, True)
    assert make_mig(b, A100.uuid, 0, 0).size == 8  # 7g.40gb takes every slot
    raises("NOT_SUPPORTED", b.set_mig_mode, L40S.uuid, True)
    b.shutdown()


def compute_modes(world: World) -> None:
    """Per GPU, persisted for other processes; NVML's invalid-argument answers."""
    b = started(world)
    assert b.compute_mode(H100.uuid) == ComputeMode.DEFAULT
    b.set_compute_mode(H100.uuid, ComputeMode.EXCLUSIVE_PROCESS)
    assert world.other_process("compute_mode", H100.uuid) == ComputeMode.EXCLUSIVE_PROCESS
    assert b.compute_mode(A100.uuid) == ComputeMode.DEFAULT  # one GPU's mode, not the node's
    raises("INVALID_ARGUMENT", b.set_compute_mode, H100.uuid, 4)
    raises("NOT_SUPPORTED", b.set_compute_mode, H100.uuid, ComputeMode.EXCLUSIVE_THREAD)
    assert b.compute_mode(H100.uuid) == ComputeMode.EXCLUSIVE_PROCESS  # refused: unchanged
    world.other_process("set_compute_mode", H100.uuid, int(ComputeMode.DEFAULT))
    assert b.compute_mode(H100.uuid) == ComputeMode.DEFAULT
    b.set_mig_mode(H200.uuid, True)  # MIG on: modes are per MIG device
    raises("NOT_SUPPORTED", b.set_compute_mode, H200.uuid, ComputeMode.PROHIBITED)
    world.inject_failure("nvmlDeviceSetComputeMode", "NO_PERMISSION", 1)
    assert isinstance(raises("NO_PERMISSION", b.set_compute_mode, L40S.uuid, 3), NvmlDeviceError)
    b.set_compute_mode(L40S.uuid, ComputeMode.PROHIBITED)
    b.shutdown()
    b.init()  # a restarted process sees the mode
    assert b.compute_mode(L40S.uuid) == ComputeMode.PROHIBITED
    b.shutdown()


def occupied_placement(world: World) -> None:
    b = started(world)
    b.set_mig_mode(H200.uuid, True)
    make_mig(b, H200.uuid, 9, 0)
    raises("INSUFFICIENT_RESOURCES", b.create_gpu_instance, H200.uuid, 5, 0)
    raises("INSUFFICIENT_RESOURCES", b.create_gpu_instance, H200.uuid, 19, 1)
    raises("INVALID_ARGUMENT", b.create_gpu_instance, H200.uuid, 9, 2)
    raises("INVALID_ARGUMENT", b.create_gpu_instance, H200.uuid, 999, 0)
    make_mig(b, H200.uuid, 20, 4)  # the one +me instance
    raises("INSUFFICIENT_RESOURCES", b.create_gpu_instance, H200.uuid, 20, 5)
    raises("INVALID_ARGUMENT", b.create_gpu_instance, H200.uuid, 14, 6)  # 2g starts at 0, 2, 4 only
    make_mig(b, H200.uuid, 15, 6)
    assert [(m.profile_id, m.start) for m in b.mig_instances(H200.uuid)] == [
        (9, 0),
        (20, 4),
        (15, 6),
    ]
    raises("INSUFFICIENT_RESOURCES", b.create_gpu_instance, H200.uuid, 14, 4)
    assert make_mig(b, H200.uuid, 19, 5).size == 1
    b.shutdown()


def persistence(world: World) -> None:
    b = started(world)
    b.set_mig_mode(H100.uuid, True)
    mine = make_mig(b, H100.uuid, 14, 2)
    assert world.other_process("mig_instances", H100.uuid) == [plain(mine)]
    gi = world.other_process("create_gpu_instance", H100.uuid, 19, 0)
    theirs = world.other_process("create_compute_instance", H100.uuid, gi)
    assert plain(b.mig_instances(H100.uuid)) == [theirs, plain(mine)]
    world.other_process("destroy_mig", H100.uuid, mine.gi_id)
    assert [m.gi_id for m in b.mig_instances(H100.uuid)] == [theirs["gi_id"]]
    raises("INSUFFICIENT_RESOURCES", b.create_gpu_instance, H100.uuid, 19, 0)
    b.shutdown()
    b.init()  # a restarted process sees the same instances
    assert [m.mig_uuid for m in b.mig_instances(H100.uuid)] == [theirs["mig_uuid"]]
    b.shutdown()


def failure_injection(world: World) -> None:
    world.inject_failure("nvmlInitWithFlags", "DRIVER_NOT_LOADED", 1)
    b = world.backend()
    raises("DRIVER_NOT_LOADED", b.init)
    b.init()
    b.set_mig_mode(H100.uuid, True)
    world.inject_failure("nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", 1)
    assert isinstance(
        raises("INSUFFICIENT_RESOURCES", b.create_gpu_instance, H100.uuid, 9, 0), NvmlDeviceError
    )
    created = make_mig(b, H100.uuid, 9, 0)
    world.inject_failure("nvmlGpuInstanceCreateComputeInstance", "UNKNOWN", 1)
    gi = b.create_gpu_instance(H100.uuid, 9, 4)
    assert isinstance(raises("UNKNOWN", b.create_compute_instance, H100.uuid, gi), NvmlDeviceError)
    # The GI is left without a compute instance; the MIG handler destroys it.
    assert [(m.gi_id, m.ci_id, m.mig_uuid) for m in b.mig_instances(H100.uuid)] == [
        (created.gi_id, created.ci_id, created.mig_uuid),
        (gi, None, None),
    ]
    b.destroy_mig(H100.uuid, gi)
    assert b.mig_instances(H100.uuid) == [created]
    world.inject_failure("nvmlSystemGetDriverVersion", "UNKNOWN", -1)
    for _ in range(3):
        raises("UNKNOWN", b.system_info)
    world.inject_failure("nvmlDeviceGetName", "GPU_IS_LOST", 2, gpu=A100.uuid)
    for _ in range(2):
        assert A100.uuid not in {g.uuid for g in b.gpus()}
    assert A100.uuid in {g.uuid for g in b.gpus()}
    b.shutdown()


def lookup_by_uuid(world: World) -> None:
    """One GPU by UUID (what MIG prepare, unprepare and a full-GPU acquire use)
    is the GPU the enumeration reports; unknown, removed or lost: None."""
    b = world.backend()
    raises("UNINITIALIZED", b.gpu, H100.uuid)
    b.init()
    for listed in b.gpus():
        assert b.gpu(listed.uuid) == listed
    assert b.gpu("GPU-00000000-0000-0000-0000-000000000000") is None
    world.remove_gpu(H100.uuid)
    world.set_lost(A100.uuid)
    assert b.gpu(H100.uuid) is None
    assert b.gpu(A100.uuid) is None
    assert b.gpu(L40S.uuid) is not None
    b.shutdown()
    b.init()
    assert b.gpu(H100.uuid) is None
    b.shutdown()


def hot_add(world: World) -> None:
    b = started(world)
    world.add_gpu(NEW)
    assert NEW.uuid not in {g.uuid for g in b.gpus()}  # NVML enumerates at init
    raises("NOT_FOUND", b.mig_profiles, NEW.uuid)
    b.shutdown()
    b.init()
    gpus = b.gpus()
    assert [g.uuid for g in gpus][-1] == NEW.uuid and gpus[-1].index == len(GPUS)
    assert gpus[-1].pci_bus_id == NEW.bdf
    b.shutdown()


def removed_lost(world: World) -> None:
    b = started(world)
    world.remove_gpu(H100.uuid)
    raises("GPU_IS_LOST", b.set_mig_mode, H100.uuid, True)
    assert H100.uuid not in {g.uuid for g in b.gpus()}
    world.set_lost(A100.uuid)
    raises("GPU_IS_LOST", b.mig_profiles, A100.uuid)
    assert {g.uuid for g in b.gpus()} == {L40S.uuid, H200.uuid, A100_80.uuid}
    b.shutdown()
    b.init()
    raises("NOT_FOUND", b.set_mig_mode, H100.uuid, True)
    assert len(b.gpus()) == len(GPUS) - 2
    b.shutdown()


def events(world: World) -> None:
    b = started(world)
    watcher = b.watch_events([H100.uuid, H200.uuid])
    assert watcher.wait(50) == []
    world.queue_xid(H100.uuid, 48)
    world.queue_xid(H100.uuid, 63)
    world.queue_xid(H200.uuid, 31)
    got: list[XidEvent] = []
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        got += watcher.wait(500)
    assert sorted(got, key=lambda e: (e.uuid, e.xid)) == [
        XidEvent(H100.uuid, 48),
        XidEvent(H100.uuid, 63),
        XidEvent(H200.uuid, 31),
    ]
    assert [e.xid for e in got if e.uuid == H100.uuid] == [48, 63]  # in order
    assert watcher.wait(50) == []  # delivered once
    world.set_lost(H200.uuid)
    assert watcher.wait(1000) == [XidEvent(H200.uuid, 79)]
    world.queue_xid(H100.uuid, 94)
    assert watcher.wait(1000) == [XidEvent(H100.uuid, 94)]
    watcher.close()
    b.shutdown()
