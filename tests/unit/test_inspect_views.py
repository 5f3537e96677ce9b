"""The ``kubectl patchbay`` renderers on recorded API objects (no cluster).

Slices and claims are written as the apiserver returns them: unqualified
attribute keys in the driver's domain, counters as ``{"value": "1"}``.
"""

from __future__ import annotations

import json

import yaml

from driver.inspect.cli import parser, render
from driver.inspect.fetch import Snapshot
from driver.inspect.nodes import nodes_view, render_nodes
from driver.inspect.topology import render_topology, topology_view
from tests.unit.inspect_node_objects import (
    NODE,
    JsonObj,
    attrs,
    claim,
    gpu,
    local_slice,
    mig_cluster,
    vf,
)


def test_mig_bar_of_a_gpu_with_a_3g_and_two_1g() -> None:
    slices, claims = mig_cluster()
    (view,) = nodes_view(slices, claims)
    bars = {g["gpu"]: g["bar"] for g in view["mig"]}
    assert bars == {"gpu-0": "[3g······]··[1g][1g]··", "gpu-1": "················"}
    # gpu-0 is cut, so neither used nor free; of its slices only the 1g at 4
    # still fits (slot 7 is free, but no 1g placement starts there).
    assert view["devices"]["gpu"] == {"total": 2, "used": 0, "free": 1}
    assert view["devices"]["mig"] == {"total": 9, "used": 3, "free": 1}
    parts = {p["device"]: (p["slots"], p["claim"]) for p in view["mig"][0]["partitions"]}
    assert parts["gpu-0-mig-3g-40gb-0"] == ([0, 1, 2, 3], "team/big")
    text = render_nodes([view], wide=True)
    assert (
        "gpu-0      [3g······]··[1g][1g]··   3g.40gb@0 team/big, 1g.10gb@5 team/small-b, "
        "1g.10gb@6 team/small-a"
    ) in text
    assert text.splitlines()[1].split() == [NODE, "0/1/2", "3/1/9", "0/1/1"]


def test_whole_gpu_taints_and_fabric_devices() -> None:
    slices, _ = mig_cluster()
    slices[1]["spec"]["devices"][1]["taints"] = [
        {"key": "patchbay.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]
    fab = {
        "name": "gpu-7-a",
        "nodeName": NODE,
        "attributes": attrs(type="gpu", attachment="fabric"),
    }
    slices.append({"metadata": {"name": "fabric"}, "spec": {
        "driver": "patchbay.dev", "perDeviceNodeSelection": True, "pool": {"name": "fabric"},
        "devices": [fab]}})  # fmt: skip
    held = claim("whole", "gpu-0")
    held["status"]["allocation"]["devices"]["results"].append(
        {"request": "f", "driver": "patchbay.dev", "pool": "fabric", "device": "gpu-7-a"}
    )
    (view,) = nodes_view(slices, [held])
    assert view["mig"][0]["bar"] == "[gpu··············]"
    assert view["tainted"] == [
        {"device": "gpu-1", "taints": ["patchbay.dev/unhealthy=xid-79:NoSchedule"]}
    ]
    assert [f["device"] for f in view["fabric"]] == ["gpu-7-a"]
    assert view["devices"]["gpu"]["total"] == 2, "fabric devices are counted apart"
    text = render_nodes([view])
    assert "tainted    gpu-1: patchbay.dev/unhealthy=xid-79:NoSchedule" in text
    assert "fabric     gpu-7-a (gpu)" in text


def test_topology_groups_roots_and_marks_pairable() -> None:
    devices = [
        gpu(0, "pci0000:3a", 0),
        gpu(1, "pci0000:85", 1),
        vf("vf-0", "pci0000:3a", 0),
        vf("vf-1", "pci0000:3a", 0),
        vf("vf-2", "pci0000:85", 1, pf="ens2f0"),
    ]
    slices = [local_slice(devices)]
    claims = [claim("pair", "gpu-1", "vf-2", pod="job-0"), claim("nic", "vf-0")]
    view = topology_view(slices, claims, NODE)
    roots = {r["pcieRoot"]: r for r in view["roots"]}
    assert list(roots) == ["pci0000:3a", "pci0000:85"], "by NUMA node"
    assert roots["pci0000:3a"]["pairable"] and not roots["pci0000:85"]["pairable"]
    assert [v["device"] for n in roots["pci0000:3a"]["nics"] for v in n["vfs"]] == ["vf-0", "vf-1"]
    assert roots["pci0000:85"]["gpus"][0]["claim"] == "team/pair"
    assert render_topology(view).splitlines() == [
        f"node {NODE}",
        "  numa 0",
        "    pci0000:3a  [pairable: free GPU + free VF]",
        "      gpu gpu-0 free",
        "      nic ens1f0 (0000:3a:00.0)",
        "        vf vf-0 used team/nic",
        "        vf vf-1 free",
        "  numa 1",
        "    pci0000:85",
        "      gpu gpu-1 used team/pair pod job-0",
        "      nic ens2f0 (0000:85:00.0)",
        "        vf vf-2 used team/pair pod job-0",
    ]


def test_topology_puts_allocated_mig_under_its_gpu() -> None:
    slices, claims = mig_cluster()
    (root,) = topology_view(slices, claims, NODE)["roots"]
    g0 = root["gpus"][0]
    assert [(m["profile"], m["claim"]) for m in g0["mig"]] == [
        ("1g.10gb", "team/small-b"), ("1g.10gb", "team/small-a"), ("3g.40gb", "team/big")
    ]  # fmt: skip
    assert root["pairable"], "gpu-0 is cut, but gpu-1 and vf-0 are free"


def test_cli_renders_json_yaml_and_wide() -> None:
    slices, claims = mig_cluster()
    slices[1]["spec"]["devices"][0]["attributes"] |= attrs(
        **{"resource.kubernetes.io/pciBusID": "0000:3b:00.0"}
    )
    args = parser().parse_args(["--context", "lab", "-n", "team", "nodes", "-o", "json"])
    (view,) = json.loads(render(args, Snapshot(slices, claims)))
    assert view["mig"][0]["bar"] == "[3g······]··[1g][1g]··"
    args = parser().parse_args(["topology", NODE, "-o", "yaml"])
    assert (
        yaml.safe_load(render(args, Snapshot(slices, claims)))["roots"][0]["pcieRoot"]
        == "pci0000:3a"
    )
    args = parser().parse_args(["topology", NODE, "-o", "wide"])
    assert (
        "      gpu gpu-0 [0000:3b:00.0] blocked"
        in render(args, Snapshot(slices, claims)).splitlines()
    )


def test_nodes_and_topology_show_nvme_drives_and_cxl_memory() -> None:
    def drive(name: str, kind: str, root: str) -> JsonObj:
        return {"name": name, "attributes": attrs(type=kind, pcieRoot=root, numaNode=0)}

    devices = [gpu(0, "pci0000:3a"), drive("nvme-0", "nvme", "pci0000:3a")]
    devices.append(drive("cxlmem-0", "cxlmem", "pci0000:3a"))
    slices = [local_slice(devices)]
    (view,) = nodes_view(slices, [claim("gds", "gpu-0", "nvme-0", pod="gds")])
    assert view["devices"]["nvme"] == {"total": 1, "used": 1, "free": 0}
    assert view["devices"]["cxlmem"] == {"total": 1, "used": 0, "free": 1}
    head, row = render_nodes([view]).splitlines()[:2]
    assert head.split()[1:6] == ["GPU", "MIG", "VF", "NVME", "CXLMEM"]
    assert row.split()[1:6] == ["1/0/1", "0/0/0", "0/0/0", "1/0/1", "0/1/1"]
    lines = render_topology(topology_view(slices, [], NODE)).splitlines()
    assert "      nvme nvme-0 free" in lines and "      cxl-memory cxlmem-0 free" in lines
