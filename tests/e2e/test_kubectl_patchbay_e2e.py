"""``kubectl patchbay nodes`` against the real control plane.

The MIG node of :mod:`tests.e2e.test_mig_e2e` (2 x H100, ``--mig-gpus=all``,
the real node agent): the real scheduler allocates a 3g and two 1g slices,
the node agent prepares them, and the installed console script
``kubectl-patchbay`` draws them on the GPU's bar from the API alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import LocalCluster
from kubernetes import client
from simnode import SimNode

from tests.e2e.test_mig_e2e import allocated, gone, pod, profile_template, running, sim

pytestmark = pytest.mark.cluster
__all__ = ["sim"]  # the module-scoped MIG node fixture
SCRIPT = Path(sys.executable).parent / "kubectl-patchbay"
WIDTH = {"1g": 1, "3g": 4}


def kubectl_patchbay(cluster: LocalCluster, *args: str) -> str:
    cmd = [str(SCRIPT), "--kubeconfig", str(cluster.kubeconfig), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def expected_bar(devices: list[str]) -> str:
    """The bar for MIG devices named ``gpu-<i>-mig-<profile>-<start>``."""
    owner: list[str | None] = [None] * 8
    for name in devices:
        profile, start = name.split("-")[3], int(name.rsplit("-", 1)[1])
        for s in range(start, start + WIDTH[profile]):
            owner[s] = name
    out, s = "", 0
    while s < 8:
        held = owner[s]
        if held is None:
            out, s = out + "··", s + 1
            continue
        width = owner.count(held)
        out, s = out + f"[{held.split('-')[3]}{'··' * (width - 1)}]", s + width
    return out


def test_nodes_draws_a_3g_and_two_1g(
    sim: SimNode,
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    ns = namespace
    names = {}
    templates = {p: profile_template(resource_api, ns, p) for p in ("3g.40gb", "1g.10gb")}
    for name, profile in (("big", "3g.40gb"), ("one", "1g.10gb"), ("two", "1g.10gb")):
        pod(core, ns, name, sim.name, templates[profile])
        running(core, ns, name)
        names[name] = allocated(core, resource_api, ns, name)
    gpu = {n.split("-mig-")[0] for n in names.values()}
    assert len(gpu) == 1, f"first fit puts all three on one GPU: {names}"
    (gpu_name,) = gpu
    bar = expected_bar(list(names.values()))
    assert bar.count("[1g]") == 2 and bar.count("[3g······]") == 1

    text = kubectl_patchbay(local_cluster, "nodes", "-o", "wide")
    print(text)
    (line,) = [x for x in text.splitlines() if x.strip().startswith(f"{gpu_name} ")]
    assert line.split()[1] == bar
    for name, dev in names.items():
        assert f"@{dev.rsplit('-', 1)[1]} {ns}/" in line, f"{name}'s claim on the bar's line"
    (row,) = [x for x in text.splitlines() if x.startswith(sim.name)]
    assert row.split()[2].startswith("3/"), "three MIG devices used"

    (view,) = [v for v in json.loads(kubectl_patchbay(local_cluster, "nodes", "-o", "json"))
               if v["node"] == sim.name]  # fmt: skip
    (g,) = [g for g in view["mig"] if g["gpu"] == gpu_name]
    assert sorted(p["device"] for p in g["partitions"]) == sorted(names.values())
    tree = kubectl_patchbay(local_cluster, "topology", sim.name)
    print(tree)
    migs = [x.split()[1] for x in tree.splitlines() if x.strip().startswith("mig ")]
    assert sorted(migs) == ["1g.10gb", "1g.10gb", "3g.40gb"], "the slices under their GPU"
    gone(core, ns, "big", "one", "two")
    after = kubectl_patchbay(local_cluster, "nodes")
    assert f"  {gpu_name:<10} {'··' * 8}" in after.splitlines(), "all slots free again"
