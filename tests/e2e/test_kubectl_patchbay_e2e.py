"""``kubectl patchbay`` against the real control plane, drawn by the
installed console script ``kubectl-patchbay`` from the API alone.

- ``nodes``: the MIG node of :mod:`tests.e2e.test_mig_e2e` (2 x H100,
  ``--mig-gpus=all``, the real node agent): the real scheduler allocates a
  3g and two 1g slices, the node agent prepares them, the bar shows them.
- ``topology`` and ``--svg``: a ``2x-h100-nic`` node (two roots, each 2 GPUs
  and a NIC's 4 VFs) with a GPU+VF pair allocated, and a prepare failure
  (a malformed VfConfig) whose ``FailedPrepareDynamicResources`` Event from
  the node agent is the claim's last error
  (:mod:`tests.e2e.test_kubectl_patchbay_fabric_e2e` has the fabric views).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e import pairing_claims as pairing
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.kubectl_views import kubectl_patchbay
from tests.e2e.mig_node import allocated, profile_template, sim
from tests.e2e.pods import claim_of, gone, pod, running
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)

pytestmark = pytest.mark.cluster
__all__ = ["sim"]  # the module-scoped MIG node fixture
SVG = "{http://www.w3.org/2000/svg}"
WIDTH = {"1g": 1, "3g": 4}


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


@pytest.fixture(scope="module")
def roots(
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimNode]:
    """A ``2x-h100-nic`` node, its PFs at 4 VFs (as the pairing tests build it)."""
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    vf_config = tmp_path_factory.mktemp("vf") / "vf.yaml"
    vf_config.write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    args = (f"--vf-config={vf_config}",)
    node = SimNode(local_cluster, unique("roots"), "2x-h100-nic", kubeconfig, args).start()
    try:

        def published() -> bool:
            node.check_alive()
            return pairing.kinds(pairing.devices(resource_api, node.name)) == {"gpu": 4, "vf": 8}

        wait_for("4 GPUs and 8 VFs published", published, timeout=90)
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


def svg_groups(path: Path) -> dict[str, list[str]]:
    """Root box id -> the device names drawn in it (the file must parse)."""
    out = {}
    for g in ET.parse(path).getroot().iter(f"{SVG}g"):
        if g.get("class") == "root":
            names = [d.get("data-device", "") for d in g.iter(f"{SVG}g")]
            out[g.get("id", "")] = [n for n in names if n]
    return out


def test_topology_of_two_roots_groups_pairs_and_draws_them(
    roots: SimNode,
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
    tmp_path: Path,
) -> None:
    ns, node = namespace, roots.name
    devs = pairing.devices(resource_api, node)
    pair = pairing.make_template(resource_api, ns, "pair", pairing.pair_spec())
    pod(core, ns, "pair", node, pair)
    running(core, ns, "pair")
    claim = claim_of(core, resource_api, ns, "pair")
    got = pairing.allocated(claim)
    root = pairing.root_of(devs[got["gpu"]])
    other = ({pairing.ROOT_A, pairing.ROOT_B} - {root}).pop()
    # Root `root` keeps one free GPU: hold it, so only `other` stays pairable.
    hold = pairing.make_template(resource_api, ns, "hold", {"requests": [
        pairing.request("gpu", "gpu.patchbay.dev", 1, root)]})  # fmt: skip
    pod(core, ns, "hold", node, hold)
    running(core, ns, "hold")

    picture = tmp_path / "topology.svg"
    text = kubectl_patchbay(local_cluster, "topology", node, "--svg", str(picture))
    print(text)
    view = json.loads(kubectl_patchbay(local_cluster, "topology", node, "-o", "json"))
    by_root = {r["pcieRoot"]: r for r in view["roots"]}
    assert set(by_root) == {pairing.ROOT_A, pairing.ROOT_B}
    drawn = svg_groups(picture)
    for r, tree in by_root.items():
        want = {t: sorted(n for n, d in devs.items()
                          if pairing.root_of(d) == r and d.attributes["type"].string == t)
                for t in ("gpu", "vf")}  # fmt: skip
        assert len(want["gpu"]) == 2 and len(want["vf"]) == 4
        assert sorted(g["device"] for g in tree["gpus"]) == want["gpu"]
        assert sorted(v["device"] for n in tree["nics"] for v in n["vfs"]) == want["vf"]
        assert sorted(drawn[f"root-{r}"]) == sorted(want["gpu"] + want["vf"]), "one box per root"
    assert sorted(n for names in drawn.values() for n in names) == sorted(devs), "every device"
    assert by_root[other]["pairable"] and not by_root[root]["pairable"]
    holder = f"used {ns}/{claim.metadata.name} pod pair"
    lines = text.splitlines()
    start = lines.index(f"    {root}")
    block = lines[start : start + 1 + 2 + 1 + 4]  # the root, its 2 GPUs, its NIC and 4 VFs
    assert f"      gpu {got['gpu']} {holder}" in block
    assert f"        vf {got['nic']} {holder}" in block
    assert f"    {other}  [pairable: free GPU + free VF]" in lines
    gone(core, ns, "pair", "hold")


def test_claims_shows_the_kubelets_prepare_error(
    roots: SimNode,
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    ns, node = namespace, roots.name
    bad = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig", "mode": "sriov"}
    config = [{"requests": ["nic"], "opaque": {"driver": "patchbay.dev", "parameters": bad}}]
    tmpl = pairing.make_template(resource_api, ns, "typo", pairing.pair_spec(config))
    pod(core, ns, "typo", node, tmpl)

    def reported() -> dict[str, Any] | None:
        rows = json.loads(kubectl_patchbay(local_cluster, "claims", "-n", ns, "-o", "json"))
        return next((r for r in rows if r["pods"] == ["typo"] and r["lastError"]), None)

    row = wait_for("the prepare failure in the claims view", reported, timeout=60)
    err = row["lastError"]
    assert err["reason"] == "FailedPrepareDynamicResources" and err["object"] == "pod/typo"
    assert err["message"].startswith("Failed to prepare dynamic resources: ")
    assert "invalid VfConfig: field mode" in err["message"], err
    assert row["state"] == "reserved" and row["node"] == node
    assert sorted(d["type"] for d in row["devices"]) == ["gpu", "vf"]
    text = kubectl_patchbay(local_cluster, "claims", "-n", ns, "-o", "wide")
    print(text)
    (line,) = [x for x in text.splitlines() if x.startswith(row["name"] + " ")]
    assert "FailedPrepareDynamicResources: Failed to prepare dynamic resources: " in line
    assert kubectl_patchbay(local_cluster, "claims", "-A").splitlines()[0].startswith("NAMESPACE")
    gone(core, ns, "typo")
