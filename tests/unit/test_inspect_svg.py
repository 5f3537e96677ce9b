"""``kubectl patchbay topology NODE --svg``: well-formed XML naming every device."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from driver.inspect import cli
from driver.inspect.fetch import Snapshot
from driver.inspect.svg import render_svg
from driver.inspect.topology import topology_view
from tests.unit.inspect_node_objects import NODE, claim, gpu, local_slice, mig_cluster, vf

SVG = "{http://www.w3.org/2000/svg}"


def two_roots() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    devices = [
        gpu(0, "pci0000:3a", 0),
        gpu(1, "pci0000:85", 1),
        vf("vf-0", "pci0000:3a", 0),
        vf("vf-1", "pci0000:3a", 0),
        vf("vf-2", "pci0000:85", 1, pf="ens2f0"),
    ]
    claims = [claim("pair", "gpu-1", "vf-2", pod="job-<0>&")]
    return [local_slice(devices)], claims


def groups(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("id", ""): g for g in root.iter(f"{SVG}g") if g.get("class") == "root"}


def device_names(g: ET.Element) -> list[str]:
    return [d.get("data-device", "") for d in g.iter(f"{SVG}g") if d.get("class") == "device"]


def test_svg_groups_gpus_and_vfs_by_root_and_names_every_device() -> None:
    slices, claims = two_roots()
    root = ET.fromstring(render_svg(topology_view(slices, claims, NODE)))
    by_root = groups(root)
    assert sorted(by_root) == ["root-pci0000:3a", "root-pci0000:85"]
    assert device_names(by_root["root-pci0000:3a"]) == ["gpu-0", "vf-0", "vf-1"]
    assert device_names(by_root["root-pci0000:85"]) == ["gpu-1", "vf-2"]
    text = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "team/pair pod job-<0>&" in text, "the holder, escaped and parsed back"
    # Only the root with a free GPU and a free VF is marked pairable.
    (rect_a,) = [r for r in by_root["root-pci0000:3a"] if r.tag == f"{SVG}rect"]
    (rect_b,) = [r for r in by_root["root-pci0000:85"] if r.tag == f"{SVG}rect"]
    assert rect_a.get("stroke-width") == "4" and rect_b.get("stroke-width") != "4"
    assert rect_a.get("fill") != rect_b.get("fill"), "each root its own colour"
    numa = [g.get("id") for g in root.iter(f"{SVG}g") if g.get("class") == "numa"]
    assert numa == ["numa-0", "numa-1"]


def test_svg_of_mig_slices_and_the_cli_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slices, claims = mig_cluster()
    view = topology_view(slices, claims, NODE)
    (g,) = groups(ET.fromstring(render_svg(view))).values()
    assert device_names(g) == [
        "gpu-0",
        "gpu-0-mig-1g-10gb-5",
        "gpu-0-mig-1g-10gb-6",
        "gpu-0-mig-3g-40gb-0",
        "gpu-1",
        "vf-0",
    ]

    async def recorded(*_: Any) -> Snapshot:
        return Snapshot(slices, claims)

    monkeypatch.setattr(cli, "snapshot", recorded)
    out = tmp_path / "t.svg"
    assert cli.main(["topology", NODE, "--svg", str(out)]) == 0
    assert ET.parse(out).getroot().tag == f"{SVG}svg"
    assert cli.main(["topology", "elsewhere", "--svg", str(tmp_path / "x.svg")]) == 1
    assert not (tmp_path / "x.svg").exists()
