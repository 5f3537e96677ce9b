"""Shares of one GPU, each idle on its own (driver.idle.shares, issue 37):
NVML's per-process samples (fake NVML) mapped to claims by the processes'
cgroups under a tmp /proc root, through the sampler, the windows and the
Idle condition written on the claim (in-memory API). Nothing sleeps."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from driver.idle.conditions import ConditionWriter
from driver.idle.reporter import IdleReporter
from driver.idle.sampler import UtilizationSampler
from driver.idle.shares import pod_of
from driver.idle.sources import Held, Source
from driver.idle.window import IdlePolicy
from driver.kube.api import claim_path
from driver.kube.memory import MemoryKube
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
POLICY = IdlePolicy(threshold=5.0, window=60.0)
WALL = datetime(2026, 12, 3, 16, 0, 0, tzinfo=UTC)
POD_A = "0f4c9a2e-1b2c-4d5e-8f90-0000000000aa"
POD_B = "0f4c9a2e-1b2c-4d5e-8f90-0000000000bb"
GPU = "GPU-0"


def cgroupfs(pod: str) -> str:
    return f"0::/kubepods/burstable/pod{pod}/3f2a9c\n"


def systemd(pod: str) -> str:
    slice_ = f"kubepods-besteffort-pod{pod.replace('-', '_')}.slice"
    return f"0::/kubepods.slice/kubepods-besteffort.slice/{slice_}/cri-containerd-3f2a.scope\n"


class World:
    def __init__(self, proc: Path) -> None:
        self.now = 0.0
        self.proc = proc
        self.machine = FakeMachine(clock=lambda: int(self.now * 1000))
        self.machine.add_gpu(GPU, "H100-SXM5-80GB", "0000:30:00.0")
        self.api = MemoryKube()
        self.held: dict[Held, Source] = {}
        sampler = UtilizationSampler(FakeNvml(self.machine), proc_root=proc)
        self.reporter = IdleReporter(POLICY, 10.0, sampler.read, lambda: self.held,
                                     ConditionWriter(self.api), clock=lambda: self.now,
                                     wall=lambda: WALL)  # fmt: skip

    def share(self, name: str, pod: str) -> Held:
        obj = self.api.add(CLAIMS, {"metadata": {"name": name}, "status": {}})
        h = Held(obj["metadata"]["uid"], "ns", name, "node-a", "gpu-0-shared", name)
        self.held[h] = Source(GPU, pods=frozenset({pod}))
        return h

    def process(self, pid: int, cgroup: str) -> None:
        (self.proc / str(pid)).mkdir()
        (self.proc / str(pid) / "cgroup").write_text(cgroup)

    async def run_until(self, until: float) -> None:
        while self.now < until:
            self.now += 10.0
            await self.reporter.round()

    async def idle(self, h: Held) -> str | None:
        claim = await self.api.get(claim_path("ns", h.claim))
        entries = (claim.get("status") or {}).get("devices") or []
        conds: list[dict[str, Any]] = [c for e in entries for c in e["conditions"]
                                       if e.get("shareID") == h.share_id]  # fmt: skip
        return next((c["status"] for c in conds if c["type"] == "Idle"), None)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_of_two_shares_only_the_idle_one_becomes_idle(world: World) -> None:
    busy, quiet = world.share("busy", POD_A), world.share("quiet", POD_B)
    world.process(100, cgroupfs(POD_A))
    world.process(200, systemd(POD_B))
    world.machine.set_utilization(GPU, 80)  # the whole GPU: busy (the rule before)
    world.machine.set_process_utilization(GPU, {100: (80, 10), 200: (1, 0)})
    await world.run_until(80.0)
    assert await world.idle(quiet) == "True"
    assert await world.idle(busy) is None  # never reported idle: nothing written


async def test_a_share_with_no_process_running_is_low(world: World) -> None:
    busy, quiet = world.share("busy", POD_A), world.share("quiet", POD_B)
    world.process(100, cgroupfs(POD_A))
    world.machine.set_utilization(GPU, 50)
    world.machine.set_process_utilization(GPU, {100: (50, 10)})
    await world.run_until(80.0)
    assert await world.idle(quiet) == "True"
    assert await world.idle(busy) is None


@pytest.mark.parametrize("cgroup", [None, "0::/system.slice/sshd.service\n", cgroupfs(POD_A)])
async def test_a_busy_process_no_share_owns_leaves_the_whole_gpu_rule(
    world: World, cgroup: str | None
) -> None:
    """No /proc entry, not a pod's, a pod no share of this GPU holds: the
    quiet share is not idle on a guess (the whole GPU is busy)."""
    world.share("busy", POD_B)
    quiet = world.share("quiet", "0f4c9a2e-1b2c-4d5e-8f90-0000000000cc")
    world.process(200, cgroupfs(POD_B))
    if cgroup is not None:
        world.process(300, cgroup)
    world.machine.set_utilization(GPU, 60)
    world.machine.set_process_utilization(GPU, {200: (1, 0), 300: (59, 0)})
    await world.run_until(80.0)
    assert await world.idle(quiet) is None


async def test_not_supported_falls_back_to_the_whole_gpu(world: World) -> None:
    busy, quiet = world.share("busy", POD_A), world.share("quiet", POD_B)
    world.process(100, cgroupfs(POD_A))
    world.machine.set_process_utilization(GPU, {100: (80, 0)})
    world.machine.inject_failure("nvmlDeviceGetProcessUtilization", "NOT_SUPPORTED", -1, GPU)
    world.machine.set_utilization(GPU, 2)  # the whole GPU is low: both shares are
    await world.run_until(80.0)
    assert await world.idle(quiet) == "True"
    assert await world.idle(busy) == "True"


def test_a_pod_uid_in_either_cgroup_driver_spelling(tmp_path: Path) -> None:
    for pid, text in ((1, cgroupfs(POD_A)), (2, systemd(POD_A)),
                      (3, "12:memory:/kubepods/pod" + POD_A + "/x\n0::/\n")):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
        assert pod_of(tmp_path, pid) == POD_A
    assert pod_of(tmp_path, 4) is None
