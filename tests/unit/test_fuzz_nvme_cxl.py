"""Fuzzed sysfs contents for the NVMe and CXL scans: the files they read (controller
and namespace attributes, dax device, region and memdev attributes) hold odd
shapes (empty, binary, not UTF-8, signs, Unicode digits, a directory in place
of a file). The property: the scans never raise; a device is offered within
the slice limits or left out, and the untouched drive is still offered."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.cxl.discovery import cxl_device, memories
from driver.nvme.discovery import scan
from driver.slices.limits import device_problems
from fabric.simhost import TOPOLOGIES, CxlMemory, SimHost
from tests.fuzzing import CONTENTS, FUZZ, Files

CTRL_FILES = ["serial", "model", "state", "transport", "address", "firmware_rev"]
NS_FILES = ["size", "nsid", "dev"]
DAX_FILES = ["size", "target_node", "dev"]
CXL_FILES = ["region/target0", "region/interleave_ways", "mem/serial"]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> SimHost:
    host = SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp_path_factory.mktemp("fuzz") / "node")
    host.hot_add("adapter0", CxlMemory(host.free_bdf("adapter0"), 0xABCDEF))
    return host


@settings(FUZZ, max_examples=60)
@given(
    st.dictionaries(st.sampled_from(CTRL_FILES), CONTENTS, max_size=2),
    st.dictionaries(st.sampled_from(NS_FILES), CONTENTS, max_size=2),
)
def test_nvme_scan_offers_well_formed_drives_or_leaves_them_out(
    host: SimHost, ctrl_files: dict[str, bytes | None], ns_files: dict[str, bytes | None]
) -> None:
    ctrl = Path(os.path.realpath(host.sysfs_root / "class" / "nvme" / "nvme0"))
    changes = Files()
    try:
        for name, content in ctrl_files.items():
            changes.put(ctrl / name, content)
        for name, content in ns_files.items():
            changes.put(ctrl / "nvme0n1" / name, content)
        found = scan(host.sysfs_root)
    finally:
        changes.restore()
    for _, device in found:
        assert device_problems(device) == [], device
    assert "0000:8a:00.0" in {d.local_id for _, d in found}, "the untouched drive is offered"


@settings(FUZZ, max_examples=60)
@given(
    st.dictionaries(st.sampled_from(DAX_FILES), CONTENTS, max_size=2),
    st.dictionaries(st.sampled_from(CXL_FILES), CONTENTS, max_size=2),
)
def test_cxl_scan_offers_well_formed_memory_or_leaves_it_out(
    host: SimHost, dax_files: dict[str, bytes | None], cxl_files: dict[str, bytes | None]
) -> None:
    dax = Path(os.path.realpath(host.sysfs_root / "bus" / "dax" / "devices" / "dax0.0"))
    mem = Path(os.path.realpath(host.sysfs_root / "bus" / "cxl" / "devices" / "mem0"))
    places = {"region": dax.parent.parent, "mem": mem}
    changes = Files()
    try:
        for name, content in dax_files.items():
            changes.put(dax / name, content)
        for name, content in cxl_files.items():
            where, _, file = name.partition("/")
            changes.put(places[where] / file, content)
        found = [cxl_device(host.sysfs_root, m) for m in memories(host.sysfs_root)]
    finally:
        changes.restore()
    for device in found:
        assert device_problems(device) == [], device
        assert re.fullmatch(r"0x[0-9a-f]{1,16}", str(device.attributes["serial"])), device
