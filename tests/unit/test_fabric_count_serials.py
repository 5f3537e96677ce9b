"""The node side of count-based fabrics: a GPU's NVML board serial is an attribute,
the node's fabric report maps each attached GPU's serial to its UUID, and the
controller reads it back to find what a manager attached by serial."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from driver.fabric_devices.naming import NodeFabric
from driver.fabric_devices.node import IDENTITY, FabricNodeView
from driver.gpu.scan import SysfsTopology, scan_gpus
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_models import MODELS
from driver.nvml.fake_state import FakeMachine


def test_gpus_carry_their_board_serial_and_the_report_maps_it_to_the_uuid(
    tmp_path: Path,
) -> None:
    machine = FakeMachine()
    machine.add_gpu("GPU-aaaa", sorted(MODELS)[0], "0000:3b:00.0", serial="1650000000042")
    (gpu,) = scan_gpus(FakeNvml(machine), SysfsTopology(tmp_path))
    assert gpu.attributes["serial"] == "1650000000042"
    # As FabricNodeView.split names a GPU behind adapter0.
    attached = dataclasses.replace(
        gpu,
        attributes={**gpu.attributes, "fabricAdapter": "adapter0", IDENTITY: gpu.local_id},
    )
    report = FabricNodeView("node-a", {}, tmp_path).report([attached])
    assert report.serials == {"1650000000042": "GPU-aaaa"}
    assert report.by_serial("1650000000042") == ("GPU-aaaa", "adapter0")
    assert report.by_serial("nope") is None
    node = {"metadata": {"annotations": {"patchbay.dev/fabric": report.to_annotation()}}}
    assert NodeFabric.from_node(node) == report


def test_a_report_without_serials_reads_as_before() -> None:
    plain = NodeFabric({"adapter0": "pci0000:15"}, {"GPU-1": "adapter0"})
    assert "serials" not in json.loads(plain.to_annotation())
    # A serial whose GPU is no longer reported attached names nothing.
    stale = NodeFabric({"adapter0": "r"}, {}, serials={"S1": "GPU-1"})
    assert stale.by_serial("S1") is None
