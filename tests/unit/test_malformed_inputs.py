"""The bugs the fuzz tests (test_fuzz_*.py) found, one plain case each: odd
claims, uevent lines, fabric bodies and sysfs contents end in a typed error
naming the input, or the odd part is ignored with a warning, never in an
escaping KeyError/TypeError/AttributeError/ValueError."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from driver.claims.allocation import parse_allocation
from driver.claims.model import ClaimRef
from driver.devices.model import NUMA_NODE
from driver.errors import ClaimError, FabricUnavailable
from driver.pci.uevents import Uevent, UeventFeed
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import physical_functions, scan_vfs
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.unit.fuzz_seeds import CHECKPOINT, CLAIM, UID, prepare_claim, start
from tests.unit.redfish_bodies import (
    CONNECTION,
    INITIATOR,
    TARGET,
    TASK,
    TASK_URI,
    client,
    inventory,
)

POOLS = {"node-a"}


def claim_with(path: list[str | int], value: Any) -> dict[str, Any]:
    claim = copy.deepcopy(CLAIM)
    node: Any = claim
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return claim


DEVICES = ["status", "allocation", "devices"]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["metadata"], None, None),  # was AttributeError
        (["status"], "0", "status must be an object, got str"),
        ([*DEVICES, "results", 0], 7, "status.allocation.devices.results[0] must be an object"),
        ([*DEVICES, "results", 0, "pool"], {"a": 1}, "results[0].pool must be a string, got dict"),
        ([*DEVICES, "results", 0, "shareID"], 3, "results[0].shareID must be a string, got int"),
        ([*DEVICES, "config", 0, "opaque"], [], "config[0].opaque must be an object, got list"),
        ([*DEVICES, "config", 0, "requests"], "gpu", "config[0].requests must be a list, got str"),
        ([*DEVICES, "results"], {"x": 1}, "devices.results must be a list, got dict"),
    ],
)
def test_odd_allocation_shapes_are_claim_errors_naming_the_field(
    path: list[str | int], value: Any, field: str | None
) -> None:
    with pytest.raises(ClaimError) as raised:
        parse_allocation(claim_with(path, value), UID, POOLS)
    if field is not None:
        assert field in str(raised.value) and "claim ns/c" in str(raised.value)


def test_a_result_without_its_request_names_it() -> None:  # was KeyError('request')
    claim = copy.deepcopy(CLAIM)
    del claim["status"]["allocation"]["devices"]["results"][0]["request"]
    with pytest.raises(ClaimError, match=r"results\[0\]\.request must be a string, got null"):
        parse_allocation(claim, UID, POOLS)


def test_a_prepare_of_an_odd_claim_fails_naming_the_field_not_internally() -> None:
    error, records, specs, active = prepare_claim(claim_with(["status"], [None]))
    assert "status must be an object, got list" in error and "internal error" not in error
    assert (records, specs, active) == ({}, [], set())


def test_the_log_context_of_an_odd_claim_is_built() -> None:
    from driver.claims.model import log_fields

    ref = ClaimRef("ns", "c", UID)
    assert log_fields(ref, {"status": 1}) == {"claim": "ns/c", "claim_uid": UID}
    odd = {"status": {"reservedFor": [None, 3, {"resource": "pods", "name": "p"}]}}
    assert log_fields(ref, odd)["pod"] == "ns/p"


def test_uevent_lines_that_are_not_objects_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "uevents.jsonl"
    path.write_text('null\n[1]\n3\n{"ACTION": "add", "SEQNUM": "x"}\n')
    (event,) = UeventFeed(path).read_new()  # was AttributeError on 'null'
    assert event.action == "add" and event.sequence_number == 0  # was ValueError
    assert caplog.text.count("skipping a malformed uevent line") == 3
    assert Uevent({"SEQNUM": "٣"}).sequence_number == 0


# Since issue 35 one malformed resource no longer fails the inventory: it is recorded in
# FabricInventory.broken (URI and the field) and the device it may concern is held back.
def test_a_connection_with_odd_links_is_recorded_broken_naming_it() -> None:
    conn = {**CONNECTION, "Links": {"TargetEndpoints": "gpu-0"}}  # was a pydantic ValidationError
    inv = inventory([INITIATOR, TARGET], [conn])
    (uri, why), *_ = inv.broken
    assert uri == conn["@odata.id"] and "Links.TargetEndpoints" in why
    assert inv.devices == () and dict(inv.held_back)["gpu-0"].startswith(f"binding {uri}")


@pytest.mark.parametrize(
    ("part", "field"),
    [({"Status": {"Health": "Meh"}}, "Status.Health"),
     ({"ConnectedEntities": [{"EntityRole": ["Target"]}]}, "ConnectedEntities.0.EntityRole")],
    ids=["health", "role"],
)  # fmt: skip
def test_an_endpoint_with_odd_fields_is_recorded_broken(part: dict[str, Any], field: str) -> None:
    target = {**TARGET, **part}
    inv = inventory([INITIATOR, target], [])
    assert [u for u, _ in inv.broken] == [TARGET["@odata.id"]]
    assert field in inv.broken[0][1] and inv.devices == ()
    assert "gpu-0" in dict(inv.held_back)


def test_a_non_hex_pci_id_is_recorded_broken() -> None:  # was ValueError from int(..., 16)
    target = copy.deepcopy(TARGET)
    target["ConnectedEntities"][0]["EntityPciId"]["VendorId"] = "zz"
    inv = inventory([INITIATOR, target], [])
    assert "VendorId" in inv.broken[0][1] and "gpu-0" in dict(inv.held_back)
    assert inv.devices == ()


def test_a_task_with_an_odd_state_is_unavailable_naming_it() -> None:
    body = {**TASK, "TaskState": "Finished"}
    with pytest.raises(FabricUnavailable, match=TASK_URI):
        asyncio.run(client({TASK_URI: body}).task(TASK_URI))


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path / "node")


CONFIG = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})


def vfs_of(host: SimHost, pf: str) -> dict[str, dict[str, Any]]:
    return {
        str(d.local_id): dict(d.attributes)
        for d in scan_vfs(host.sysfs_root, CONFIG)
        if d.attributes["pfPciBusID"] == pf
    }


def test_a_pf_with_an_odd_total_vfs_is_left_out_and_the_other_served(
    host: SimHost, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = physical_functions(host.sysfs_root)
    (first.path / "sriov_totalvfs").write_text("eight\n")  # was ValueError out of scan_vfs
    assert [pf.bdf for pf in physical_functions(host.sysfs_root)] == [second.bdf]
    assert vfs_of(host, first.bdf) == {} and len(vfs_of(host, second.bdf)) == second.num_vfs
    assert "sriov_totalvfs holds 'eight'" in caplog.text


def test_odd_vf_ids_fall_back_and_an_odd_numa_node_is_omitted(host: SimHost) -> None:
    vf = host.tree.path_of("0000:1a:00.2")
    (vf / "vendor").write_bytes(b"\x00")  # was published as vendorID "000\x00"
    (vf / "device").write_bytes(b"\xff\xfe")  # was: the VF left out (UnicodeDecodeError)
    (vf / "numa_node").write_text("\u0663\n")  # was: the VF left out (ValueError)
    attrs = vfs_of(host, "0000:1a:00.0")["0000:1a:00.2"]
    assert attrs["vendorID"] == "15b3" and attrs["deviceID"] == "0000"
    assert NUMA_NODE not in attrs or attrs[NUMA_NODE] == 0  # the PF's node, when it has one


def test_a_unicode_digit_link_type_is_not_a_crash(host: SimHost) -> None:
    first, _ = physical_functions(host.sysfs_root)
    (netdev,) = (first.path / "net").iterdir()
    (netdev / "type").write_text("\u00b2\n")  # "²".isdigit() is True, int("²") fails
    (pf,) = [p for p in physical_functions(host.sysfs_root) if p.bdf == first.bdf]
    assert pf.link_type == "ethernet"


@pytest.mark.parametrize(
    ("key", "uid", "why"),
    [
        (UID.replace("40", "41"), UID, "holds the record of claim"),  # unprepare: KeyError
        ("not-a-uuid", "not-a-uuid", "is not keyed by a claim UID"),  # recover: CdiError
    ],
)
def test_a_checkpoint_not_keyed_by_claim_uids_is_corrupt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str, uid: str, why: str
) -> None:
    data = copy.deepcopy(CHECKPOINT)
    data["claims"] = {key: {**data["claims"][UID], "uid": uid}}
    prep, _ = start(tmp_path, data)
    assert prep.checkpoint.claims == {} and why in caplog.text
    assert list(tmp_path.glob("cp.json.corrupt-*")), "moved aside, not lost"
    assert asyncio.run(prep.recover()) == (0, 0)
