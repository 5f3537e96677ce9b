"""Per-PF VF bandwidth: the slices a bandwidth-managed PF publishes, the line
rate they carry, and the share a prepared VF's container is told."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.errors import ConfigError
from driver.slices.build import PoolSpec, build_slices
from driver.slices.limits import MAX_COUNTERS_PER_SET, device_problems
from driver.vf.config import PfPoolConfig, load_pool_config
from driver.vf.discovery import scan
from driver.vf.prepare import VfHandler
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.claims_doubles import Reader

PF_A = "0000:1a:00.0"  # ens0f0np0, 8 VFs 0000:1a:00.2-.9, root pci0000:15
TIERED = PfPoolConfig.model_validate(
    {"pfs": [{"pciAddress": PF_A, "bandwidthTiers": ["40G", "10G", "25G"]}]}
)


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path / "node")


def speed_file(host: SimHost) -> Path:
    return host.tree.path_of(PF_A) / "net" / "ens0f0np0" / "speed"


def test_the_simulated_nic_reports_its_line_rate(host: SimHost) -> None:
    assert speed_file(host).read_text().strip() == "100000"


def test_tiers_consume_the_pfs_line_rate_and_their_vf(host: SimHost) -> None:
    found = scan(host.sysfs_root, TIERED)
    names = [d.name for d in found.devices]
    # VF by VF, tiers ascending: the allocator's first fit is the smallest tier.
    assert names[:4] == [
        "vf-0000-1a-00-2-10g",
        "vf-0000-1a-00-2-25g",
        "vf-0000-1a-00-2-40g",
        "vf-0000-1a-00-3-10g",
    ]
    assert len(names) == 8 * 3  # only PF A is selected
    sets = {s.name: dict(s.counters) for s in found.counter_sets}
    assert sets == {
        "pf-0000-1a-00-0": {"bandwidth": "100G"},
        "pf-0000-1a-00-0-vfs0": {f"vf-{i}": "1" for i in range(8)},
    }
    shape = next(d for d in found.devices if d.name == "vf-0000-1a-00-3-40g").to_json()
    assert shape["capacity"] == {"bandwidth": {"value": "40G"}}
    assert shape["consumesCounters"] == [
        {"counterSet": "pf-0000-1a-00-0", "counters": {"bandwidth": {"value": "40G"}}},
        {"counterSet": "pf-0000-1a-00-0-vfs0", "counters": {"vf-1": {"value": "1"}}},
    ]
    attrs = shape["attributes"]
    assert attrs["pfLineRateMbps"] == {"int": 100000}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}  # pairing
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:1a:00.3"}
    assert "allowMultipleAllocations" not in shape  # each tier is an exclusive VF
    assert all(device_problems(d) == [] for d in found.devices)


def test_slices_hold_the_counter_sets_apart_from_the_tiers(host: SimHost) -> None:
    found = scan(host.sysfs_root, TIERED)
    pool = PoolSpec(
        "patchbay.dev", "node", "node-patchbay", {"nodeName": "node"}, found.devices,
        found.counter_sets,
    )  # fmt: skip
    slices = [s.spec for s in build_slices(pool)]
    assert [sorted(c["name"] for c in s["sharedCounters"]) for s in slices[:1]] == [
        ["pf-0000-1a-00-0", "pf-0000-1a-00-0-vfs0"]
    ]
    assert "devices" not in slices[0]
    assert sum(len(s.get("devices", [])) for s in slices[1:]) == 24


def test_unmanaged_pfs_keep_their_plain_vfs(host: SimHost) -> None:
    config = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})
    found = scan(host.sysfs_root, config)
    assert found.counter_sets == ()
    assert "vf-0000-1a-00-2" in {d.name for d in found.devices}
    assert all(not d.consumes_counters and not d.capacity for d in found.devices)


def test_line_rate_from_sysfs_caps_the_tiers(host: SimHost) -> None:
    speed_file(host).write_text("25000\n")
    found = scan(host.sysfs_root, TIERED)
    assert {d.name.rsplit("-", 1)[1] for d in found.devices} == {"10g", "25g"}
    assert dict(found.counter_sets[0].counters) == {"bandwidth": "25G"}


def test_unknown_line_rate_offers_nothing_until_line_rate_is_set(host: SimHost) -> None:
    speed_file(host).write_text("-1\n")  # what the kernel says while the link is down
    assert scan(host.sysfs_root, TIERED) == scan(host.sysfs_root, PfPoolConfig())
    pinned = PfPoolConfig.model_validate(
        {"pfs": [{"pciAddress": PF_A, "bandwidthTiers": ["40G"], "lineRate": "200G"}]}
    )
    found = scan(host.sysfs_root, pinned)
    assert len(found.devices) == 8
    assert dict(found.counter_sets[0].counters) == {"bandwidth": "200G"}


def test_many_vfs_spread_over_counter_sets_of_32(host: SimHost) -> None:
    from driver.vf.bandwidth import counter_sets

    sets = counter_sets(PF_A, 100_000, list(range(70)))
    assert [s.name for s in sets] == [
        "pf-0000-1a-00-0",
        "pf-0000-1a-00-0-vfs0",
        "pf-0000-1a-00-0-vfs1",
        "pf-0000-1a-00-0-vfs2",
    ]
    assert max(len(s.counters) for s in sets) == MAX_COUNTERS_PER_SET
    assert dict(sets[3].counters) == {f"vf-{i}": "1" for i in range(64, 70)}


@pytest.mark.parametrize(
    ("tiers", "needle"),
    [
        ("[]", "field pfs.0.bandwidthTiers: Value error, must be a non-empty list"),
        ("[40]", "field pfs.0.bandwidthTiers: Value error, 40 is not a positive whole"),
        ("[1G, 2G, 3G, 4G, 5G, 6G, 7G, 8G, 9G]", "9 tiers (at most 8)"),
        ("[40G]\n    lineRate: fast", "field pfs.0.lineRate"),
    ],
)
def test_bad_bandwidth_config_names_the_field(tmp_path: Path, tiers: str, needle: str) -> None:
    path = tmp_path / "vf.yaml"
    path.write_text(f"pfs:\n  - name: ens0f0np0\n    bandwidthTiers: {tiers}\n")
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_pool_config(path)


def test_prepared_tier_names_its_share_under_its_vfs_prefix(host: SimHost) -> None:
    tiers = {d.name: d for d in scan(host.sysfs_root, TIERED).devices}
    handler = VfHandler(host.sysfs_root, host.dir / "dev")
    prep = handler.prepare(tiers["vf-0000-1a-00-2-40g"], str(uuid.uuid4()), None)
    assert set(prep.edits.env) == {
        "PATCHBAY_VF_0000_1A_00_2_PCI_BUS_ID=0000:1a:00.2",
        "PATCHBAY_VF_0000_1A_00_2_MODE=netdev",
        "PATCHBAY_VF_0000_1A_00_2_NETDEV=ens0f0np0v0",
        "PATCHBAY_VF_0000_1A_00_2_BANDWIDTH_MBPS=40000",
    }


async def test_two_tiers_of_one_vf_are_never_prepared_together(
    host: SimHost, tmp_path: Path
) -> None:
    inv = NodeInventory()
    inv.replace_pool("node", scan(host.sysfs_root, TIERED).devices)
    reader = Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    handlers = {"vf": VfHandler(host.sysfs_root, host.dir / "dev")}
    prep = ClaimPreparer(reader, inv, handlers, store, CdiRegistry(tmp_path / "cdi"))
    first = reader.add("first", {"nic": ["vf-0000-1a-00-2-40g"]}, pool="node")
    second = reader.add("second", {"nic": ["vf-0000-1a-00-2-10g"]}, pool="node")
    assert (await prep.prepare([first]))[first.uid].error == ""
    refused = (await prep.prepare([second]))[second.uid].error
    assert f"already prepared for claim {first.uid}" in refused
    spec = json.loads(next((tmp_path / "cdi").glob("*.json")).read_text())
    assert "PATCHBAY_VF_0000_1A_00_2_BANDWIDTH_MBPS=40000" in json.dumps(spec)
