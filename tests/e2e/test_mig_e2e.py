"""Dynamic MIG end to end on the real control plane.

One simulated node of 2 x H100 with ``--mig-gpus=all``: the real scheduler
allocates partitions from our counters, the node agent prepares them
through our socket, and the C NVML mock holds the instances. Covers
distinct non-overlapping partitions, a full-GPU claim that waits for them,
a new geometry on the same GPU without restarts, the first-fit model of the
MIG benchmark against the real scheduler, and a ``kill -9`` between GI and
CI creation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from driver.mig.handler import CRASH_AFTER_GI
from tests.bench.mig_bench import FirstFit, profile_is
from tests.e2e.mig_node import (
    PER_GPU,
    allocated,
    devices,
    gpu_state,
    instances,
    profile_template,
    sim,
    slice_specs,
    template,
)
from tests.e2e.pods import gone, phase, pod, refused, running
from tests.harness.simnode import SimNode

__all__ = ["sim"]  # the module-scoped MIG node fixture

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def visible(sim: SimNode, ns: str, name: str) -> str:
    record = sim.agent.pod_record(ns, name)
    assert record is not None
    containers = record["containers"]
    assert isinstance(containers, dict)
    (container,) = containers.values()
    (env,) = [e for e in container["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return str(env.split("=", 1)[1])


def test_partitions_are_published_and_valid(
    sim: SimNode, resource_api: client.ResourceV1Api
) -> None:
    specs = slice_specs(resource_api, sim.name)
    sets = [cs for s in specs for cs in s.get("sharedCounters") or []]
    assert sorted(cs["name"] for cs in sets) == ["gpu-0-mig", "gpu-1-mig"]
    assert all(len(cs["counters"]) == 10 for cs in sets)
    devs = devices(resource_api, sim.name)
    migs = [d for d in devs if d["attributes"]["type"]["string"] == "mig"]
    assert len(migs) == 2 * (PER_GPU - 1)
    # Lean placements (issue 26): a partition's GPU is its counter set, not an attribute.
    assert {d["consumesCounters"][0]["counterSet"] for d in migs} == {"gpu-0-mig", "gpu-1-mig"}
    assert not any("parentUUID" in d["attributes"] for d in migs)
    full = [d for d in devs if d["attributes"]["type"]["string"] == "gpu"]
    assert all(len(d["consumesCounters"][0]["counters"]) == 10 for d in full)


def test_partitions_full_gpu_and_new_geometry(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, pid = namespace, sim.plugin.proc.pid if sim.plugin.proc else None
    model = FirstFit(slice_specs(resource_api, sim.name))
    names = {}
    for profile in ("1g.10gb", "2g.20gb", "3g.40gb"):
        pod(core, ns, profile[:2], sim.name, profile_template(resource_api, ns, profile))
        running(core, ns, profile[:2])
        names[profile] = allocated(core, resource_api, ns, profile[:2])
        predicted = model.allocate(profile_is(profile))
        assert predicted is not None and predicted["name"] == names[profile], "first-fit model"
    # driver.mig.order: the bottom GPU first; 1g and 2g left half first, high
    # start first; 3g at 4 before 0.
    assert names == {"1g.10gb": "gpu-0-mig-1g-10gb-3", "2g.20gb": "gpu-0-mig-2g-20gb-0",
                     "3g.40gb": "gpu-0-mig-3g-40gb-4"}  # fmt: skip
    mig_uuids = {visible(sim, ns, p) for p in ("1g", "2g", "3g")}
    assert len(mig_uuids) == 3 and all(u.startswith("MIG-") for u in mig_uuids)
    state = instances(sim, 0)
    assert [(p, s) for p, s, _ in state] == [(9, 4), (14, 0), (19, 3)], "non-overlapping"
    assert {u for _, _, cis in state for u in cis} == mig_uuids
    assert gpu_state(sim, 0)["mig_current"] and not gpu_state(sim, 1)["mig_current"]

    template(resource_api, ns, "whole-0", "gpu.patchbay.dev",
             'device.attributes["patchbay.dev"].index == 0')  # fmt: skip
    pod(core, ns, "whole", sim.name, "whole-0")
    print("whole GPU:", refused(core, ns, "whole"))  # a full-GPU claim waits for the partitions
    assert phase(core, ns, "whole") == "Pending"
    gone(core, ns, "1g", "2g", "3g")
    running(core, ns, "whole")
    assert instances(sim, 0) == [] and not gpu_state(sim, 0)["mig_current"]
    assert visible(sim, ns, "whole") == gpu_state(sim, 0)["uuid"]
    gone(core, ns, "whole")

    for profile in ("4g.40gb", "3g.40gb"):
        tmpl = f"mig-{profile.replace('.', '-')}"
        if profile == "4g.40gb":
            tmpl = profile_template(resource_api, ns, profile)
        pod(core, ns, f"b{profile[:2]}", sim.name, tmpl)
        running(core, ns, f"b{profile[:2]}")
    assert [(p, s) for p, s, _ in instances(sim, 0)] == [(5, 0), (9, 4)], "a new geometry"
    assert sim.plugin.proc is not None and sim.plugin.proc.pid == pid, "no restart"
    gone(core, ns, "b4g", "b3g")
    assert instances(sim, 0) == [] and not gpu_state(sim, 0)["mig_current"]


def test_kill_between_gi_and_ci_is_recovered(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns = namespace
    sim.plugin.stop()
    sim.plugin.start(PATCHBAY_CRASH_POINT=CRASH_AFTER_GI)
    tmpl = profile_template(resource_api, ns, "2g.20gb")
    pod(core, ns, "crash", sim.name, tmpl)
    assert sim.plugin.wait_exit(90) != 0, "killed at the crash point"
    half = instances(sim, 0)
    # 2g at 2: the first of its placements in our order (driver.mig.order)
    assert [(p, s, cis) for p, s, cis in half] == [(14, 2, [])], "a GI without CI is left"
    sim.plugin.start()
    running(core, ns, "crash", timeout=120)
    (after,) = instances(sim, 0)
    assert after[:2] == (14, 2) and len(after[2]) == 1 and visible(sim, ns, "crash") == after[2][0]
    gone(core, ns, "crash")
    assert instances(sim, 0) == [] and not gpu_state(sim, 0)["mig_current"]
