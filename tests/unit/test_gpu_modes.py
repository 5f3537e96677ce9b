"""``--compatibility-groups`` (driver.gpu.modes): what the slices say with it
on (KEP-5963 groups instead of the whole-counter trick) and that off they
are exactly what the pre-existing pipeline (MIG scan, then shared twins) builds."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

from driver.checkpoint import Checkpoint
from driver.devices.kind import Discovery
from driver.devices.model import CounterConsumption, Device
from driver.gpu.fraction import SharePolicy, with_shared
from driver.gpu.kind import GpuType
from driver.gpu.modes import with_compatibility_groups
from driver.gpu.scan import SysfsTopology, devices_of
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.settingsflags import parse_settings
from driver.slices.build import PoolSpec, build_slices
from driver.slices.limits import device_problems
from plugin.settings import PluginSettings


def node(groups: bool) -> tuple[GpuType, MigSupport]:
    """Two H100s: GPU 0 with dynamic MIG, GPU 1 without; both shareable."""
    machine = FakeMachine()
    machine.add_gpu("GPU-0000", "H100-SXM5-80GB", "0000:10:00.0")
    machine.add_gpu("GPU-0001", "H100-SXM5-80GB", "0000:20:00.0")
    backend = FakeNvml(machine)
    support = MigSupport(
        NvmlSession(backend),
        MigPolicy.parse("0", "", True, False),
        lambda s, g: MigHandler(s, g, Path("/nonexistent")),
        Checkpoint,
    )
    share = SharePolicy.parse("all", 1024)
    gpus = GpuType(
        backend, Path("/x"), Path("/x"), mig=support, share=share, compatibility_groups=groups
    )
    return gpus, support


def slices_json(found: Discovery) -> str:
    pool = PoolSpec("patchbay.dev", "node-a", "node-a-patchbay", {"nodeName": "node-a"},
                    found.devices, found.counter_sets)  # fmt: skip
    return json.dumps([s.spec for s in build_slices(pool)], sort_keys=True)


def test_off_the_slices_are_what_mig_then_shares_build() -> None:
    gpus, support = node(groups=False)
    found = gpus.discover()
    # The pipeline before the setting existed, on the same machine.
    before = with_shared(
        support.discover(partial(devices_of, topology=SysfsTopology(Path("/x")))),
        SharePolicy.parse("all", 1024),
    )
    assert found == before
    assert slices_json(found) == slices_json(before)
    assert "compatibilityGroups" not in slices_json(found)
    consumption = CounterConsumption("gpu-0-whole", (("gpu", "1"),))
    assert json.dumps(consumption.to_json()) == (
        '{"counterSet": "gpu-0-whole", "counters": {"gpu": {"value": "1"}}}'
    )


def test_on_placements_and_shares_are_in_groups_of_their_own() -> None:
    on = {d.name: d for d in node(groups=True)[0].discover().devices}
    off_found = node(groups=False)[0].discover()
    off = {d.name: d for d in off_found.devices}
    assert list(on) == list(off), "same devices, same order"

    # The full GPUs: untouched (no group: never co-allocated with a grouped device).
    assert on["gpu-0"] == off["gpu-0"] and on["gpu-1"] == off["gpu-1"]
    assert on["gpu-0"].consumes_counters[0].counter_set == "gpu-0-mig"
    assert on["gpu-1"].consumes_counters[0].counter_set == "gpu-1-whole"
    # Each MIG placement: its counters as before, in group "mig".
    placements = [n for n in on if n.startswith("gpu-0-mig-")]
    assert placements
    for name in placements:
        [was] = off[name].consumes_counters
        assert on[name].consumes_counters == (replace(was, compatibility_groups=("mig",)),)
        assert replace(on[name], consumes_counters=()) == replace(off[name], consumes_counters=())
    # The shares: nothing of the GPU's set (the trick replaced), in group "shared".
    assert on["gpu-0-shared"].consumes_counters == (
        CounterConsumption("gpu-0-mig", (("mem0", "0"),), ("shared",)),
    )
    assert on["gpu-1-shared"].consumes_counters == (
        CounterConsumption("gpu-1-whole", (("gpu", "0"),), ("shared",)),
    )
    assert on["gpu-0-shared"].to_json()["consumesCounters"] == [
        {"counterSet": "gpu-0-mig", "counters": {"mem0": {"value": "0"}},
         "compatibilityGroups": ["shared"]}
    ]  # fmt: skip
    assert all(device_problems(d) == [] for d in on.values())


def test_on_leaves_counters_of_other_families_alone() -> None:
    vf = Device(
        name="vf-0",
        kind="vf",
        local_id="0000:30:00.1",
        consumes_counters=(CounterConsumption("pf-0000-30-00-0", (("bandwidth", "40G"),)),),
    )
    found = Discovery(devices=(vf,))
    assert with_compatibility_groups(found) == found


def test_one_name_across_flag_env_and_default() -> None:
    assert not parse_settings(PluginSettings, ["--node-name=n"], {}).compatibility_groups
    flag = parse_settings(PluginSettings, ["--node-name=n", "--compatibility-groups=true"], {})
    env = parse_settings(PluginSettings, ["--node-name=n"], {"COMPATIBILITY_GROUPS": "true"})
    assert flag.compatibility_groups and env.compatibility_groups
