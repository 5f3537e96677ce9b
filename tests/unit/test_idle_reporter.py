"""Idle detection end to end in one process (driver.idle): NVML fake readings,
the windows, and the Idle condition written on the claim (in-memory API).

Time is two injected clocks: the reporter's (seconds) and the fake NVML's
(ms, for GPM); nothing sleeps."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from driver.idle.conditions import ConditionWriter, field_manager
from driver.idle.reporter import IdleReporter
from driver.idle.sampler import UtilizationSampler
from driver.idle.sources import Held, Source
from driver.idle.window import IdlePolicy
from driver.kube.api import claim_path
from driver.kube.memory import MemoryKube
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
POLICY = IdlePolicy(threshold=5.0, window=60.0)
WALL = datetime(2026, 12, 3, 16, 0, 0, tzinfo=UTC)


class World:
    def __init__(self) -> None:
        self.now = 0.0  # the reporter's clock, seconds
        self.machine = FakeMachine(clock=lambda: int(self.now * 1000))
        for i in range(3):
            self.machine.add_gpu(f"GPU-{i}", "H100-SXM5-80GB", f"0000:3{i}:00.0")
        self.nvml = FakeNvml(self.machine)
        self.api = MemoryKube()
        self.held: dict[Held, Source] = {}
        self.sampler = UtilizationSampler(self.nvml)
        self.reporter = self.make_reporter()

    def make_reporter(self) -> IdleReporter:
        return IdleReporter(POLICY, 10.0, self.sampler.read, lambda: self.held,
                            ConditionWriter(self.api), clock=lambda: self.now,
                            wall=lambda: WALL)  # fmt: skip

    def claim(self, name: str, device: str, source: Source) -> Held:
        obj = self.api.add(CLAIMS, {"metadata": {"name": name}, "status": {}})
        h = Held(obj["metadata"]["uid"], "ns", name, "node-a", device, None)
        self.held[h] = source
        return h

    async def run_until(self, until: float, step: float = 10.0) -> None:
        while self.now < until:
            self.now += step
            await self.reporter.round()

    async def conditions(self, h: Held) -> dict[str, dict[str, Any]]:
        claim = await self.api.get(claim_path("ns", h.claim))
        entries = (claim.get("status") or {}).get("devices") or []
        return {c["type"]: c for e in entries if e["device"] == h.device
                for c in e["conditions"]}  # fmt: skip

    def applies(self) -> int:
        return sum(1 for method, _ in self.api.requests if method == "APPLY")


@pytest.fixture
def world() -> World:
    return World()


async def test_low_for_the_window_writes_idle_busy_never_writes(world: World) -> None:
    idle = world.claim("idle", "gpu-0", Source("GPU-0"))
    busy = world.claim("busy", "gpu-1", Source("GPU-1"))
    world.machine.set_utilization("GPU-0", 2)
    world.machine.set_utilization("GPU-1", 90)
    await world.run_until(60.0)  # low from 10 s: 50 s of the 60 s window
    assert await world.conditions(idle) == {}
    await world.run_until(70.0)
    cond = (await world.conditions(idle))["Idle"]
    assert (cond["status"], cond["reason"]) == ("True", "BelowThreshold")
    assert "since 2026-12-03T15:59:00Z (highest 2%)" in cond["message"], cond
    assert world.reporter.idle() == {idle}
    await world.run_until(200.0)
    assert world.applies() == 1  # idle stays idle: written once; busy never
    busy_reads = [m for m, p in world.api.requests if p == claim_path("ns", "busy")]
    assert busy_reads == ["GET"]  # held when the reporter started: one look for a stale Idle
    assert await world.conditions(busy) == {}


async def test_an_idle_device_that_gets_busy_is_cleared_once(world: World) -> None:
    h = world.claim("c", "gpu-0", Source("GPU-0"))
    await world.run_until(70.0)  # 0 % from the start
    assert (await world.conditions(h))["Idle"]["status"] == "True"
    world.machine.set_utilization("GPU-0", 50)
    await world.run_until(90.0)
    cond = (await world.conditions(h))["Idle"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False", "Busy", "utilization 50% (threshold 5%)")  # fmt: skip
    assert world.applies() == 2


async def test_unknown_utilization_is_never_idle(world: World) -> None:
    h = world.claim("c", "gpu-0", Source("GPU-0"))
    await world.run_until(70.0)
    assert (await world.conditions(h))["Idle"]["status"] == "True"
    world.nvml.init()
    world.nvml.set_mig_mode("GPU-0", True)  # NOT_SUPPORTED from now on
    world.nvml.shutdown()
    await world.run_until(200.0)
    cond = (await world.conditions(h))["Idle"]
    assert (cond["status"], cond["reason"]) == ("False", "UtilizationUnknown")


async def test_a_mig_device_reads_gpm_between_rounds(world: World) -> None:
    world.nvml.init()
    world.nvml.set_mig_mode("GPU-2", True)
    gi = world.nvml.create_gpu_instance("GPU-2", 9, 0)
    world.nvml.create_compute_instance("GPU-2", gi)
    world.nvml.shutdown()
    h = world.claim("c", "gpu-2-mig-3g-0", Source("GPU-2", gi))
    world.machine.set_utilization("GPU-2", 40, gi_id=gi)
    await world.run_until(10.0)
    assert world.reporter.utilization_samples() == []  # one GPM sample: no reading yet
    world.machine.set_utilization("GPU-2", 1, gi_id=gi)  # at 10 s
    await world.run_until(15.0, step=5.0)
    assert world.reporter.utilization_samples() == [(("ns", "c", "node-a", h.device), 1.0)]
    world.now += 5.0
    world.machine.set_utilization("GPU-2", 41, gi_id=gi)  # at 20 s
    world.now += 5.0
    await world.reporter.round()  # 15..25 s: 1 % for 5 s, 41 % for 5 s
    assert world.reporter.utilization_samples() == [(("ns", "c", "node-a", h.device), 21.0)]


async def test_a_restarted_plugin_corrects_a_stale_idle_only_on_evidence(world: World) -> None:
    h = world.claim("c", "gpu-0", Source("GPU-0"))
    await world.run_until(70.0)
    assert (await world.conditions(h))["Idle"]["status"] == "True"
    world.reporter = world.make_reporter()  # a new process: it does not know what was written
    await world.run_until(100.0)  # still low, the window not yet full again
    assert world.applies() == 1  # the earlier Idle=True stands, nothing flaps
    world.machine.set_utilization("GPU-0", 30)
    world.reporter = world.make_reporter()
    await world.run_until(110.0)  # its first reading is busy: the stale Idle goes
    assert (await world.conditions(h))["Idle"]["status"] == "False"


async def test_a_failed_write_is_retried_with_backoff(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="driver.idle.conditions")
    h = world.claim("c", "gpu-0", Source("GPU-0"))
    path = claim_path("ns", "c") + "/status"
    world.api.fail("APPLY", path, 403, times=2)
    await world.run_until(70.0)  # fails at 70 s; retry after 10-12 s
    await world.run_until(80.0)  # too early: not tried
    assert [m for m, p in world.api.requests if p == path] == ["APPLY"]
    await world.run_until(100.0)  # tried at 90 s (fails), next after 20-24 s
    await world.run_until(130.0)
    assert (await world.conditions(h))["Idle"]["status"] == "True"
    assert [m for m, p in world.api.requests if p == path] == ["APPLY"] * 3
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned  # once per device, not at every retry


async def test_idle_seconds_and_devices_that_go(world: World) -> None:
    h = world.claim("c", "gpu-0", Source("GPU-0"))
    await world.run_until(40.0)
    assert world.reporter.idle_seconds_samples() == [(("ns", "c", "node-a", "gpu-0"), 30.0)]
    del world.held[h]
    await world.run_until(50.0)
    assert world.reporter.idle_seconds_samples() == []


def test_each_device_entry_has_its_own_field_manager() -> None:
    a = Held("u", "ns", "c", "node-a", "gpu-0", None)
    b = Held("u", "ns", "c", "node-a", "gpu-0", "share-1")
    assert field_manager(a) == "patchbay.dev/idle/gpu-0"
    assert field_manager(b) == "patchbay.dev/idle/gpu-0/share-1"


def test_readings_map(world: World) -> None:
    readings: Mapping[Source, float | None] = world.sampler.read([Source("GPU-1")])
    assert readings == {Source("GPU-1"): 0.0}


async def test_a_busy_device_prepared_while_running_costs_no_request(world: World) -> None:
    await world.run_until(10.0)  # the reporter's first round: nothing held
    busy = world.claim("late", "gpu-1", Source("GPU-1"))
    world.machine.set_utilization("GPU-1", 90)
    await world.run_until(300.0)
    assert [p for _, p in world.api.requests if p.startswith(claim_path("ns", "late"))] == []
    assert world.reporter.utilization_samples() == [(("ns", "late", "node-a", busy.device), 90.0)]


def test_nvml_down_reads_unknown_and_back(world: World) -> None:
    world.machine.inject_failure("nvmlInitWithFlags", "DRIVER_NOT_LOADED", times=1)
    assert world.sampler.read([Source("GPU-1"), Source("GPU-2", 1)]) == {
        Source("GPU-1"): None, Source("GPU-2", 1): None}  # fmt: skip
    world.machine.set_utilization("GPU-1", 12)
    assert world.sampler.read([Source("GPU-1")]) == {Source("GPU-1"): 12.0}
