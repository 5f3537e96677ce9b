"""Each fabric the launcher starts has a log of its own.

Why: the e2e tests count lines in the fabric's log (a detach task each), and
an xdist worker runs many fabric modules, one after another, in one run
directory. A new module's fabric must not count the requests an earlier
module's fabric logged there (read once as 1 and 11 detaches of a GPU that
was never detached); a restart of the same fabric keeps its log. Against the
real ``patchbay-fabric`` process (tests/harness/fabricsim's launcher).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.harness.cluster_proc import set_aside
from tests.harness.fabricsim import ControllerProcess, FabricService, switch
from tests.harness.poll import wait_for

pytestmark = pytest.mark.integration
ROOT = "/redfish/v1/Fabrics/pcie0"
ATTACHED = "attach gpu-0 -> node-a-adapter0"


def spec(tmp_path: Path) -> dict[str, Any]:
    host = tmp_path / "node-a"
    if not host.exists():
        SimHost.build(TOPOLOGIES["fabric-adapters"](), host, "node-a")
    return {"switches": [switch("sw0", [("node-a", "adapter0", host)], ["gpu-0"])]}


def attach_gpu0(fabric: FabricService) -> None:
    body = {
        "Links": {
            "InitiatorEndpoints": [{"@odata.id": f"{ROOT}/Endpoints/node-a-adapter0"}],
            "TargetEndpoints": [{"@odata.id": f"{ROOT}/Endpoints/gpu-0"}],
        }
    }
    req = urllib.request.Request(
        f"{fabric.url}{ROOT}/Connections", method="POST", data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {fabric.token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 202)


def logged(fabric: FabricService, line: str) -> bool:
    return line in fabric.log_path.read_text(errors="replace")


def test_a_new_fabric_logs_apart_from_an_earlier_one_and_a_restart_keeps_its_log(
    tmp_path: Path,
) -> None:
    first = FabricService(tmp_path / "fabric", spec(tmp_path), insecure=True).start()
    try:
        attach_gpu0(first)
        wait_for("the first fabric's attach logged", lambda: logged(first, ATTACHED), timeout=30)
        first.stop()
        first.start()  # a restart of the same fabric: its log goes on
        assert first.log_path.read_text().count("--- start: ") == 2
        assert logged(first, ATTACHED)
    finally:
        first.stop()
    said = first.log_path.read_text()

    second = FabricService(tmp_path / "fabric", spec(tmp_path), insecure=True).start()
    try:
        assert second.log_path == first.log_path  # the same place, a new log
        text = second.log_path.read_text()
        assert text.count("--- start: ") == 1 and ATTACHED not in text
        assert second.attach_requests() == []
    finally:
        second.stop()
    # The earlier fabric's log is kept beside it, whole.
    assert (tmp_path / "fabric" / "fabric.log.1").read_text() == said


def test_set_aside_keeps_every_earlier_log_oldest_first(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert set_aside(log) is None  # nothing there: nothing moved
    for text in ("one", "two", "three"):
        log.write_text(text)
        set_aside(log)
    assert not log.exists()
    assert [(tmp_path / f"x.log.{n}").read_text() for n in (1, 2, 3)] == ["one", "two", "three"]


def test_a_new_controller_launcher_sets_aside_the_earlier_controllers_log(tmp_path: Path) -> None:
    fabric = FabricService(tmp_path / "fabric", spec(tmp_path), insecure=True)
    log = tmp_path / "logs" / "controller.log"
    log.parent.mkdir()
    log.write_text("an earlier module's controller: detach gpu-0 from fab-1\n")
    ctl = ControllerProcess(tmp_path / "kubeconfig", fabric, log)
    assert ctl.log_path == log and not log.exists()  # its own log starts empty
    assert "detach gpu-0" in (tmp_path / "logs" / "controller.log.1").read_text()
