"""The simulated fabric is a conformant Redfish service (issue 22).

One real ``patchbay-fabric`` (tests/harness/fabricsim's launcher, HTTPS with its CA)
over a populated CXL fabric: a GPU, a NIC, an NVMe drive and a CXL Type 3
memory expander attached to simulated hosts (two through POST Connections,
two through the zone dialect), a spare GPU and an empty slot. Then:

- DMTF's Redfish Service Validator (``rf_service_validator --skipschema``
  with the DSP8010 CSDL in ``../shared/redfish/csdl``, Session login)
  crawls every resource: 0 failures; its counts are printed.
- DMTF's Redfish Protocol Validator: no failure but the checks listed in
  :data:`INAPPLICABLE`, each with the reason (also docs/redfish-conformance.md).
- The behaviours the validators do not exercise: session login/logout and
  Basic auth, a zone PATCH with ETag/If-Match through to the host, the task
  monitor's answers, CXL memory the host will not release, identities that
  agree between the Redfish resources and what the node sees in sysfs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests import figures
from tests.harness.fabricsim import REPO, FabricService

pytestmark = pytest.mark.integration
CSDL = REPO.parent / "shared" / "redfish" / "csdl"
BIN = Path(sys.executable).parent
F = "/redfish/v1/Fabrics/cxl0"
USER = "patchbay"
# Protocol-validator checks that cannot apply to this service, and why.
INAPPLICABLE = {
    "PROTO_HTTP_UNSUPPORTED_METHODS": "aiohttp's HTTP parser (llhttp) answers a request line "
    "with a method it does not know (FAKEMETHODFORTEST) with 400 before any application "
    "code runs; every known method a route lacks is 405 with Allow",
}


def _slot(port: str, device: dict[str, Any] | None) -> dict[str, Any]:
    return {"port": port, "device": device} if device else {"port": port}


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FabricService]:
    root = tmp_path_factory.mktemp("redfish")
    for node in ("node-a", "node-b"):
        SimHost.build(TOPOLOGIES["fabric-adapters"](), root / node, node)
    up: list[dict[str, Any]] = [
        {"port": f"up{i}", "node": n, "adapter": "adapter0", "hostDir": str(root / n)}
        for i, n in enumerate(("node-a", "node-b"))
    ]
    # node-a's adapter room: a Virtual CXL Switch with five vPPBs (gpu-0, nvme-0,
    # both LDs, and gpu-1 in the zone test).
    up[0]["vppbs"] = 5
    devices: list[dict[str, Any] | None] = [
        {"kind": "gpu", "id": "gpu-0"},
        {"kind": "nic", "id": "nic-0", "netdev": "fab0f0", "totalVfs": 2, "numVfs": 2},
        {"kind": "nvme", "id": "nvme-0"},
        {"kind": "cxlmem", "id": "cxl-0", "memoryMiB": 65536},
        {"kind": "gpu", "id": "gpu-1"},
        None,
        # A multi-logical device: two LDs, both attached to node-a (issue 35).
        {"kind": "cxlmem", "id": "mld-0", "memoryMiB": 65536, "logicalDevices": 2},
    ]
    slots = [_slot(f"slot{i}", d) for i, d in enumerate(devices)]
    spec = {
        "id": "cxl0",
        "type": "CXL",
        "switches": [{"id": "sw0", "upstream": up, "slots": slots}],
    }
    svc = FabricService(root / "fabric", spec)
    svc.start(attach_latency=0.05)
    for device, node in (("gpu-0", "node-a"), ("nvme-0", "node-a")):
        status, headers, _ = call(svc, "POST", f"{F}/Connections", attach_body(node, device))
        assert status == 202
        assert follow(svc, headers["Location"])[0] == 201
    for device in ("nic-0", "cxl-0"):
        status, headers, _ = zone_patch(svc, "node-b-adapter0", add=device)
        assert status == 202
        assert follow(svc, headers["Location"])[0] == 201
    for device in ("mld-0-ld0", "mld-0-ld1"):  # Connections 5 and 6
        status, headers, _ = call(svc, "POST", f"{F}/Connections", attach_body("node-a", device))
        assert status == 202
        assert follow(svc, headers["Location"])[0] == 201
    yield svc
    svc.stop()


def call(
    svc: FabricService,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    auth: bool = True,
) -> tuple[int, dict[str, str], Any]:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if auth and not any(k in sent for k in ("Authorization", "X-Auth-Token")):
        sent["Authorization"] = f"Bearer {svc.token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(svc.url + path, method=method, data=data, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=10, context=svc.ssl_context()) as resp:
            status, got, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        status, got, raw = err.code, dict(err.headers), err.read()
    return status, got, json.loads(raw) if raw else None


def attach_body(node: str, device: str) -> dict[str, Any]:
    return {
        "Links": {
            "InitiatorEndpoints": [{"@odata.id": f"{F}/Endpoints/{node}-adapter0"}],
            "TargetEndpoints": [{"@odata.id": f"{F}/Endpoints/{device}"}],
        }
    }


def zone_patch(
    svc: FabricService, zone: str, add: str = "", remove: str = "", etag: str | None = None
) -> tuple[int, dict[str, str], Any]:
    status, headers, body = call(svc, "GET", f"{F}/Zones/{zone}")
    assert status == 200 and headers["ETag"] == body["@odata.etag"]
    members = [m["@odata.id"] for m in body["Links"]["Endpoints"]]
    members = [m for m in members if not m.endswith(f"/{remove}")] if remove else members
    members += [f"{F}/Endpoints/{add}"] if add else []
    patch = {"Links": {"Endpoints": [{"@odata.id": m} for m in members]}}
    match = {"If-Match": headers["ETag"] if etag is None else etag}
    return call(svc, "PATCH", f"{F}/Zones/{zone}", patch, match)


def follow(svc: FabricService, monitor: str) -> tuple[int, dict[str, str], Any]:
    """Poll a task monitor until it stops answering 202 (DSP0266 13.2)."""
    assert monitor.startswith("/redfish/v1/TaskService/TaskMonitors/"), monitor
    deadline = time.monotonic() + 30
    while True:
        status, headers, body = call(svc, "GET", monitor)
        if status != 202:
            return status, headers, body
        assert body["TaskState"] in ("New", "Running") and time.monotonic() < deadline
        time.sleep(0.05)


def _validator_env(svc: FabricService) -> dict[str, str]:
    return dict(os.environ, REQUESTS_CA_BUNDLE=str(svc.ca_bundle))


def test_dmtf_service_validator_finds_no_failure(fabric: FabricService, tmp_path: Path) -> None:
    assert (CSDL / "Endpoint_v1.xml").exists(), f"the DSP8010 CSDL is missing under {CSDL}"
    argv = [
        str(BIN / "rf_service_validator"), "--rhost", fabric.url, "--authtype", "Session",
        "--user", USER, "--password", fabric.token, "--skipschema",
        "--schema_directory", str(CSDL), "--logdir", str(tmp_path),
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, env=_validator_env(fabric))
    out = run.stdout + run.stderr
    counts = re.search(r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|", out)
    assert counts, out[-3000:]
    passed, warned, failed, untested = map(int, counts.groups())
    figures.report(
        f"DMTF service validator: {passed} pass, {warned} warn, {failed} fail,"
        f" {untested} not tested"
    )
    fails = [line for p in tmp_path.rglob("*.log") for line in p.read_text().splitlines()]
    assert failed == 0, "\n".join(line for line in fails if " - FAIL - " in line)
    # No Oem extras without a schema, no deprecated Links.Ports: nothing to warn about.
    assert warned == 0, "\n".join(line for line in fails if " - WARNING - " in line)
    # Guard against a crawl that stopped early: every kind of resource was validated.
    for uri in (
        f"{F}/Zones/node-b-adapter0", f"{F}/Connections/4", "/redfish/v1/Systems/node-a",
        "/redfish/v1/Chassis/cxl0-sw0/PCIeDevices/cxl-0/CXLLogicalDevices/0",
        "/redfish/v1/Chassis/cxl0-sw0/Drives/nvme-0",
        "/redfish/v1/Chassis/cxl0-sw0/Processors/gpu-0",
        f"{F}/Switches/sw0/VCSs/up0", f"{F}/Switches/sw0/VCSs/up0/VPPBs/3",
    ):  # fmt: skip
        assert f"Validating {uri}..." in out, uri
    assert passed > 1000


def test_dmtf_protocol_validator_passes_its_applicable_checks(
    fabric: FabricService, tmp_path: Path
) -> None:
    argv = [
        str(BIN / "rf_protocol_validator"), "--rhost", fabric.url, "--user", USER,
        "--password", fabric.token, "--report-dir", str(tmp_path), "--report-type", "tsv",
        "--avoid-http-redirect", "--ca-bundle", str(fabric.ca_bundle),
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, env=_validator_env(fabric))
    summary = re.search(r"PASS: (\d+), WARN: (\d+), FAIL: (\d+), NOT_TESTED: (\d+)", run.stdout)
    assert summary, run.stdout[-3000:] + run.stderr[-3000:]
    passed, warned, failed, untested = summary.groups()
    figures.report(
        f"DMTF protocol validator: {passed} pass, {warned} warn, {failed} fail"
        f" (inapplicable: {', '.join(INAPPLICABLE)}), {untested} not tested"
    )
    rows = [line.split("\t") for p in tmp_path.glob("*.tsv") for line in p.read_text().splitlines()]
    failed = [r for r in rows if len(r) > 4 and r[4] == "FAIL"]
    for row in failed:
        print("FAIL", row[0], row[5] if len(row) > 5 else "")
    assert sorted({r[0] for r in failed} - set(INAPPLICABLE)) == []


def test_session_login_logout_and_basic_auth(fabric: FabricService) -> None:
    creds = {"UserName": USER, "Password": fabric.token}
    status, headers, body = call(
        fabric, "POST", "/redfish/v1/SessionService/Sessions", creds, auth=False
    )
    assert status == 201 and headers["Location"] == body["@odata.id"]
    token = {"X-Auth-Token": headers["X-Auth-Token"]}
    assert call(fabric, "GET", "/redfish/v1/Systems", headers=token)[0] == 200
    assert call(fabric, "DELETE", headers["Location"], headers=token)[0] == 204
    status, _, body = call(fabric, "GET", "/redfish/v1/Systems", headers=token)
    assert status == 401 and body["error"]["code"].endswith("NoValidSession")
    bad = {**creds, "Password": "wrong"}
    assert call(fabric, "POST", "/redfish/v1/SessionService/Sessions", bad, auth=False)[0] == 401
    for password, want in ((fabric.token, 200), ("wrong", 401)):
        basic = base64.b64encode(f"{USER}:{password}".encode()).decode()
        got = call(fabric, "GET", f"{F}/Endpoints", headers={"Authorization": f"Basic {basic}"})
        assert got[0] == want
    assert call(fabric, "GET", f"{F}/Endpoints", auth=False)[0] == 401


def test_zone_patch_attaches_and_detaches_on_the_host(fabric: FabricService) -> None:
    host = SimHost.open(fabric.dir.parent / "node-a")
    status, _, body = zone_patch(fabric, "node-a-adapter0", add="gpu-1", etag='W/"stale"')
    assert status == 412 and body["error"]["code"].endswith("PreconditionFailed")
    assert "gpu-1" not in json.dumps(call(fabric, "GET", f"{F}/Zones/node-a-adapter0")[2])
    status, headers, task = zone_patch(fabric, "node-a-adapter0", add="gpu-1")
    assert status == 202 and task["TaskMonitor"] == headers["Location"]
    status, headers, conn = follow(fabric, headers["Location"])
    assert status == 201 and headers["Location"] == conn["@odata.id"]
    assert conn["Status"]["State"] == "Enabled"
    processor = call(fabric, "GET", "/redfish/v1/Chassis/cxl0-sw0/Processors/gpu-1")[2]
    assert f"GPU-{processor['UUID']}" in host.gpu_uuids().values()
    audit = [(a["target"], a["dialect"]) for a in fabric.attach_requests()]
    assert audit.count(("gpu-1", "zones")) == 1
    status, headers, _ = zone_patch(fabric, "node-a-adapter0", remove="gpu-1")
    assert status == 202 and follow(fabric, headers["Location"])[0] == 204
    assert f"GPU-{processor['UUID']}" not in host.gpu_uuids().values()
    # Two changes at once are refused, naming the field.
    status, _, body = zone_patch(fabric, "node-a-adapter0", add="gpu-1", remove="gpu-0")
    assert status == 400 and "Links.Endpoints" in body["error"]["message"]


def test_cxl_memory_in_use_keeps_the_device_attached(fabric: FabricService) -> None:
    conn = "/redfish/v1/Fabrics/cxl0/Connections/4"
    assert "cxl-0" in json.dumps(call(fabric, "GET", conn)[2]["Links"])
    fabric.faults(devices={"cxl-0": {"memoryInUse": True}})
    status, headers, _ = call(fabric, "DELETE", conn)
    assert status == 202
    status, _, body = follow(fabric, headers["Location"])
    assert status == 500 and "in use" in body["error"]["message"], body
    assert call(fabric, "GET", conn)[2]["Status"]["State"] == "Enabled"
    host = SimHost.open(fabric.dir.parent / "node-b")
    assert list((host.sysfs_root / "bus/cxl/devices").glob("mem*"))
    fabric.faults(devices={"cxl-0": {"memoryInUse": False}})


def test_identities_agree_with_what_the_nodes_see(fabric: FabricService) -> None:
    chassis = "/redfish/v1/Chassis/cxl0-sw0"
    node_a = SimHost.open(fabric.dir.parent / "node-a")
    node_b = SimHost.open(fabric.dir.parent / "node-b")
    gpu = call(fabric, "GET", f"{chassis}/Processors/gpu-0")[2]
    assert gpu["ProcessorType"] == "GPU" and f"GPU-{gpu['UUID']}" in node_a.gpu_uuids().values()
    drive = call(fabric, "GET", f"{chassis}/Drives/nvme-0")[2]
    seen = [p.read_text().strip() for p in node_a.sysfs_root.glob("class/nvme/*/serial")]
    assert drive["SerialNumber"] in seen
    ld = call(fabric, "GET", f"{chassis}/PCIeDevices/cxl-0/CXLLogicalDevices/0")[2]
    gcxlid = ld["Identifiers"][0]["DurableName"]
    serial = int(gcxlid.split(":")[0].replace("-", ""), 16)
    mem = [int(p.read_text(), 16) for p in node_b.sysfs_root.glob("bus/cxl/devices/mem*/serial")]
    assert mem == [serial] and ld["MemorySizeMiB"] == 65536
    nic_fn = call(fabric, "GET", f"{chassis}/NetworkAdapters/nic-0/NetworkDeviceFunctions/0")[2]
    mac = nic_fn["Ethernet"]["PermanentMACAddress"]
    macs = node_b.sysfs_root.glob("bus/pci/devices/*/net/*/address")
    assert mac in {p.read_text().strip() for p in macs}
    # Each LD of the MLD: its own memdev on node-a, with its share, the serial shared.
    mld = [call(fabric, "GET", f"{chassis}/PCIeDevices/mld-0/CXLLogicalDevices/{k}")[2]
           for k in (0, 1)]  # fmt: skip
    ids = [m["Identifiers"][0]["DurableName"] for m in mld]
    assert [i.split(":")[1] for i in ids] == ["0000", "0001"] and ids[0][:23] == ids[1][:23]
    serial = int(ids[0].split(":")[0].replace("-", ""), 16)
    mem_a = [int(p.read_text(), 16) for p in node_a.sysfs_root.glob("bus/cxl/devices/mem*/serial")]
    assert mem_a == [serial, serial] and {m["MemorySizeMiB"] for m in mld} == {32768}
    function = call(fabric, "GET", f"{chassis}/PCIeDevices/nvme-0/PCIeFunctions/0")[2]
    assert (function["ClassCode"], function["DeviceClass"]) == ("0x010802", "MassStorageController")


def test_cxl_memory_can_be_marked_while_its_detach_runs(fabric: FabricService) -> None:
    """While a refused hot-remove is asked again (the controller retries), the
    memory stays on its host: the mark applies during the detach too. Last in
    the module: cxl-0 leaves node-b."""
    conn = "/redfish/v1/Fabrics/cxl0/Connections/4"
    host = SimHost.open(fabric.dir.parent / "node-b")
    fabric.faults(detachLatencySeconds=3600, devices={"cxl-0": {"memoryInUse": True}})
    try:
        status, headers, _ = call(fabric, "DELETE", conn)
        assert status == 202 and call(fabric, "GET", conn)[2]["Status"]["State"] == "Disabled"
        fabric.faults(devices={"cxl-0": {"memoryInUse": False}})
    finally:
        fabric.faults(detachLatencySeconds=0)  # releases the held detach task
    assert follow(fabric, headers["Location"])[0] == 204  # no longer in use: it left
    assert not list((host.sysfs_root / "bus/cxl/devices").glob("mem*"))
