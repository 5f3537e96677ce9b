"""Contract scenarios of how busy a GPU or a MIG device looks to NVML.

Why apart from ``tests.contract.scenarios``: the same contract (the fake
and the C mock must both answer so) for what idle detection (issue 37)
reads: a whole GPU's utilization rate, NOT_SUPPORTED while MIG is on, and
a MIG device's SM utilization from two GPM samples, on Hopper and newer;
a shared GPU's per-process samples (``nvmlDeviceGetProcessUtilization``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from driver.idle.sampler import UtilizationSampler
from driver.idle.sources import Source
from tests.contract.scenarios import A100, H100, H200, L40S, make_mig, raises, started
from tests.contract.world import World


def utilization(world: World) -> None:
    """A whole GPU's rate, as set, live and per GPU; with MIG on it is
    NOT_SUPPORTED and each GPU instance has its own GPM SM utilization,
    which survives a MIG change the library writes back."""
    b = started(world)
    assert b.utilization(H100.uuid) == 0  # nothing set: an idle GPU
    world.set_utilization(H100.uuid, 73)
    assert b.utilization(H100.uuid) == 73
    assert b.utilization(L40S.uuid) == 0  # one GPU's rate, not the node's
    assert world.other_process("utilization", H100.uuid) == 73
    world.set_utilization(L40S.uuid, 5)
    assert b.utilization(L40S.uuid) == 5

    b.set_mig_mode(H100.uuid, True)
    raises("NOT_SUPPORTED", b.utilization, H100.uuid)  # NVML: not on a MIG-enabled GPU
    busy = make_mig(b, H100.uuid, 9, 0)
    world.set_utilization(H100.uuid, 40, gi_id=busy.gi_id)
    idle = make_mig(b, H100.uuid, 9, 4)  # written back by the library: 40 % stays
    first = b.mig_sample(H100.uuid, busy.gi_id)
    second = b.mig_sample(H100.uuid, busy.gi_id)
    assert b.mig_utilization(first, second) == 40.0
    quiet = [b.mig_sample(H100.uuid, idle.gi_id) for _ in range(2)]
    assert b.mig_utilization(*quiet) == 0.0  # its own instance's, not the GPU's
    raises("INVALID_ARGUMENT", b.mig_utilization, first, quiet[1])  # two devices
    world.set_utilization(H100.uuid, 100, gi_id=busy.gi_id)
    third = b.mig_sample(H100.uuid, busy.gi_id)
    fourth = b.mig_sample(H100.uuid, busy.gi_id)
    assert b.mig_utilization(third, fourth) == 100.0
    assert 40.0 <= b.mig_utilization(first, fourth) <= 100.0  # the mean over the span
    for sample in (first, second, third, fourth, *quiet):
        sample.close()
    first.close()  # twice: harmless
    raises("NOT_FOUND", b.mig_sample, H100.uuid, 14)  # no such GPU instance

    raises("NOT_SUPPORTED", b.mig_sample, H200.uuid, 1)  # Hopper, but MIG is off
    b.set_mig_mode(A100.uuid, True)
    world.reset_gpu(A100.uuid)  # Ampere: MIG mode takes effect at the reset
    ampere = make_mig(b, A100.uuid, 9, 0)
    raises("NOT_SUPPORTED", b.mig_sample, A100.uuid, ampere.gi_id)  # GPM: Hopper and newer

    world.inject_failure("nvmlDeviceGetUtilizationRates", "UNKNOWN", 1, L40S.uuid)
    raises("UNKNOWN", b.utilization, L40S.uuid)
    assert b.utilization(L40S.uuid) == 5
    world.set_lost(H100.uuid)
    raises("GPU_IS_LOST", b.mig_sample, H100.uuid, busy.gi_id)
    world.set_lost(L40S.uuid)
    raises("GPU_IS_LOST", b.utilization, L40S.uuid)
    b.shutdown()


def process_utilization(world: World) -> None:
    """Each process's samples as set, per GPU, live in another process; none
    set is no sample (NVML's NOT_FOUND, an empty list); NOT_SUPPORTED while
    MIG is on; an injected failure once."""
    b = started(world)
    assert b.process_utilization(L40S.uuid) == []  # nothing running: no sample
    world.set_process_utilization(L40S.uuid, {4242: (80, 12), 4243: (0, 0)})
    got = {p.pid: (p.sm, p.memory) for p in b.process_utilization(L40S.uuid)}
    assert got == {4242: (80, 12), 4243: (0, 0)}
    assert all(p.timestamp > 0 for p in b.process_utilization(L40S.uuid))
    assert b.process_utilization(H200.uuid) == []  # one GPU's processes, not the node's
    other = world.other_process("process_utilization", L40S.uuid)
    assert {p["pid"]: p["sm"] for p in other} == {4242: 80, 4243: 0}
    world.set_process_utilization(L40S.uuid, {4243: (150, 3)})
    assert [(p.pid, p.sm, p.memory) for p in b.process_utilization(L40S.uuid)] == [(4243, 100, 3)]
    world.inject_failure("nvmlDeviceGetProcessUtilization", "NOT_SUPPORTED", 1, L40S.uuid)
    raises("NOT_SUPPORTED", b.process_utilization, L40S.uuid)  # a GPU NVML cannot tell
    assert len(b.process_utilization(L40S.uuid)) == 1
    b.set_mig_mode(H100.uuid, True)
    raises("NOT_SUPPORTED", b.process_utilization, H100.uuid)
    world.set_lost(L40S.uuid)
    raises("GPU_IS_LOST", b.process_utilization, L40S.uuid)
    b.shutdown()


def shares_by_process(world: World) -> None:
    """The idle sampler on this backend (pynvml over the C mock, or the fake):
    two shares of one GPU, each read by its own pod's processes (cgroups
    under a tmp /proc root); a busy process no share owns gives both the
    whole GPU's rate; with MIG on (NOT_SUPPORTED) the GPU's rule too."""
    pods = ("0f4c9a2e-1b2c-4d5e-8f90-0000000000aa", "0f4c9a2e-1b2c-4d5e-8f90-0000000000bb")
    b = started(world)
    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp)
        for pid, pod in ((100, pods[0]), (200, pods[1]), (300, None)):
            (proc / str(pid)).mkdir()
            path = f"/kubepods/burstable/pod{pod}/c" if pod else "/system.slice/x.service"
            (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")
        busy, quiet = (Source(L40S.uuid, pods=frozenset({p})) for p in pods)
        sampler = UtilizationSampler(b, proc_root=proc)
        world.set_utilization(L40S.uuid, 70)
        world.set_process_utilization(L40S.uuid, {100: (70, 9), 200: (0, 0)})
        assert sampler.read({busy, quiet}) == {busy: 70.0, quiet: 0.0}
        world.set_process_utilization(L40S.uuid, {100: (40, 9), 300: (30, 0)})
        assert sampler.read({busy, quiet}) == {busy: 70.0, quiet: 70.0}  # 300: no share's
        b.set_mig_mode(H100.uuid, True)
        on_mig = Source(H100.uuid, pods=frozenset({pods[0]}))
        assert sampler.read({on_mig}) == {on_mig: None}  # MIG on: no rate at all, unknown
    b.shutdown()
