"""The fabric's test-only attach audit and its ``Idempotency-Key`` handling,
against the real ``patchbay-fabric`` process (tests/harness/fabricsim's launcher).

The audit (``GET /patchbay/v1/audit``) is how the e2e tests count the attach
requests an allocation caused; a repeat of a request with the same
``Idempotency-Key`` must answer the first answer and not count again."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.harness.fabricsim import FabricService, switch

pytestmark = pytest.mark.integration
ROOT = "/redfish/v1/Fabrics/pcie0"


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[FabricService]:
    host = tmp_path / "node-a"
    SimHost.build(TOPOLOGIES["fabric-adapters"](), host, "node-a")
    spec = {"switches": [switch("sw0", [("node-a", "adapter0", host)], ["gpu-0", "gpu-1"])]}
    svc = FabricService(tmp_path / "fabric", spec, insecure=True).start(attach_latency=0.05)
    yield svc
    svc.stop()


def post(fabric: FabricService, body: Any, key: str | None) -> tuple[int, str, Any]:
    headers = {"Authorization": f"Bearer {fabric.token}", "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(
        f"{fabric.url}{ROOT}/Connections", method="POST", data=json.dumps(body).encode(),
        headers=headers,
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Location", ""), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, "", json.loads(err.read())


def attach_body(device: str) -> dict[str, Any]:
    return {
        "Links": {
            "InitiatorEndpoints": [{"@odata.id": f"{ROOT}/Endpoints/node-a-adapter0"}],
            "TargetEndpoints": [{"@odata.id": f"{ROOT}/Endpoints/{device}"}],
        }
    }


def test_a_repeat_with_the_same_key_answers_the_first_answer(fabric: FabricService) -> None:
    first = post(fabric, attach_body("gpu-0"), "alloc-1")
    assert first[0] == 202 and first[1].startswith("/redfish/v1/TaskService/")
    again = post(fabric, attach_body("gpu-0"), "alloc-1")
    assert again == first  # the same status, task monitor and body: not acted on again
    audit = fabric.attach_requests()
    assert [(a["target"], a["initiator"], a["dialect"]) for a in audit] == [
        ("gpu-0", "node-a/adapter0", "connections")
    ]
    # The key, reused for another request, is refused instead of answered wrongly.
    status, _, body = post(fabric, attach_body("gpu-1"), "alloc-1")
    assert status == 422 and "Idempotency-Key" in body["error"]["message"]
    # Without a key every request is a new request (answered with the connection
    # or its open task: already attached or attaching to this initiator).
    assert post(fabric, attach_body("gpu-0"), None)[0] in (200, 202)
    assert len(fabric.attach_requests()) == 2


def test_a_refusal_is_remembered_too(fabric: FabricService) -> None:
    fabric.faults(devices={"gpu-1": {"foreignOwner": "tenant-b"}})
    first = post(fabric, attach_body("gpu-1"), "alloc-2")
    assert first[0] == 409
    fabric.faults(devices={"gpu-1": {"foreignOwner": ""}})
    # The repeat answers the refusal it got first, though an attach would now succeed.
    assert post(fabric, attach_body("gpu-1"), "alloc-2") == first
    assert len(fabric.attach_requests()) == 1
