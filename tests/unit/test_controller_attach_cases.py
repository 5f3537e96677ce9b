"""The attach tells three kinds of fabric trouble apart (issue 35): the manager
unreachable and one resource broken are waited out and hold nothing; an
attach refused (4xx) holds the device. Each is an Event on the claim whose
reason names the case and whose note names the request (method and URI).
The real workers, holds, status writer and event recorder on the shipped
in-memory API and fabric (as in test_fabric_trouble)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from driver.controller.attach import cases
from driver.controller.attach import connect as w
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.events import ControllerEvents
from driver.errors import (
    AttachFailed,
    CountAttachFailed,
    FabricApiError,
    FabricAttachConflict,
    FabricAttachRefused,
    FabricConflict,
    FabricMalformed,
    FabricNotFound,
    FabricResourceBroken,
    FabricTlsError,
    FabricUnreachable,
)
from driver.fabric_devices.naming import FAILED_CONDITION, READY_CONDITION
from driver.fabricclient.memory import MemoryFabric
from driver.kube.api import RESOURCE_V1
from driver.kube.events import EVENTS_V1, EventRecorder
from driver.kube.memory import MemoryKube
from driver.metrics import FABRIC_UNREADABLE
from tests.unit.fabric_objects import ALLOC, CLAIM, GPU, VARIANT, node

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"
CONNECTIONS = "/redfish/v1/Fabrics/PCIe/Connections"
ENDPOINT = "/redfish/v1/Fabrics/PCIe/Endpoints/gpu-0"


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "RETRY_S", 0.02)
    monkeypatch.setattr(w, "RETRY_CAP_S", 0.1)


def cause_of_failure(exc: Exception) -> Exception:
    try:
        raise AttachFailed("budget spent") from exc
    except AttachFailed as failed:
        return failed


@pytest.mark.parametrize(
    ("exc", "case"),
    [
        (FabricUnreachable("fabric GET /redfish/v1/: no answer within 10 s"), cases.UNREACHABLE),
        (FabricTlsError("certificate refused"), cases.UNREACHABLE),
        (FabricApiError(503, "ServiceTemporarilyUnavailable", "busy"), cases.UNREACHABLE),
        (FabricApiError(401, "CredentialsRefused", "no"), cases.UNREACHABLE),
        (FabricResourceBroken("held back", ""), cases.BROKEN),
        (FabricMalformed("expected a Redfish Endpoint body", ENDPOINT), cases.BROKEN),
        (FabricApiError(500, "InternalError", "boom", "POST", CONNECTIONS), cases.BROKEN),
        (FabricAttachRefused(400, "ActionNotSupported", "no", "POST", CONNECTIONS), cases.REFUSED),
        (FabricAttachConflict(409, "ResourceInUse", "elsewhere"), cases.REFUSED),
        (FabricConflict(409, "ResourceInUse", "tenant-b"), cases.REFUSED),
        (FabricNotFound(404, "ResourceNotFound", "not reachable"), cases.REFUSED),
        (CountAttachFailed(200, "WrongModel", "an H200 arrived"), cases.FAILED),
        (AttachFailed("task failed"), cases.FAILED),
        (cause_of_failure(FabricUnreachable("refused")), cases.UNREACHABLE),
        (cause_of_failure(FabricApiError(502, "BadGateway", "x")), cases.BROKEN),
    ],
)
def test_each_error_has_its_case(exc: Exception, case: str) -> None:
    assert cases.case_of(exc) == case
    assert cases.holds(case) == (case in (cases.REFUSED, cases.FAILED))


class Setup:
    def __init__(self, budget: float = 30.0) -> None:
        self.api, self.fabric = MemoryKube(), MemoryFabric([GPU])
        self.api.add(CLAIMS, CLAIM)
        self.reports, self.done = NodeReports(), asyncio.Event()
        self.holds = FailedHolds(300.0, lambda: None)
        self.recorder = EventRecorder(self.api, "patchbay.dev/controller", "ctl-0")
        self.workers = Workers(
            self.fabric, ClaimStatusWriter(self.api, "fabric"), self.reports, self.holds, 60.0,
            self.done.set, ControllerEvents(self.recorder), unreachable_budget=budget,
        )  # fmt: skip
        self.reports.refresh({"node-a": node({"GPU-0": "adapter0"})})

    async def attach(self) -> dict[str, str]:
        """The claim's device condition once the attach ended: type -> reason."""
        self.workers.attach(ALLOC, VARIANT)
        await asyncio.wait_for(self.done.wait(), 20)
        await self.recorder.drain()
        entries = (self.api.objects(CLAIMS)[0].get("status") or {}).get("devices") or []
        return {c["type"]: c["reason"] for e in entries for c in e.get("conditions") or []}

    def events(self, reason: str) -> list[str]:
        """The notes of the claim's Events of ``reason``."""
        return [
            e["note"]
            for e in self.api.objects(f"{EVENTS_V1}/namespaces/default/events")
            if e["reason"] == reason and e["regarding"]["name"] == "claim"
        ]


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    s = Setup()
    task = asyncio.create_task(s.recorder.run())
    yield s
    task.cancel()


async def test_a_500_to_the_attach_request_is_waited_out_and_holds_nothing(setup: Setup) -> None:
    s = setup
    broken = FabricApiError(500, "InternalError", "agent down", "POST", CONNECTIONS)
    s.fabric.fail("attach", broken, times=2)
    counted = FABRIC_UNREADABLE.labels("error_answer")._value.get()
    assert await s.attach() == {READY_CONDITION: "Attached"}
    assert "gpu-0" not in s.holds and s.fabric.attached == [("gpu-0", "node-a", "adapter0")]
    (note,) = s.events(cases.BROKEN)  # one Event for the one error, not one per try
    print(note)
    assert f"fabric POST {CONNECTIONS}: HTTP 500 InternalError: agent down" in note
    assert "a fabric resource the attach needs is broken" in note and "not held" in note
    # Counted by cause as the client's reads count theirs: once per attach and error.
    assert FABRIC_UNREADABLE.labels("error_answer")._value.get() == counted + 1


async def test_a_device_a_read_held_back_is_waited_for_naming_its_endpoint(
    setup: Setup,
) -> None:
    s = setup
    why = f"its endpoint {ENDPOINT} is unreadable: fabric GET {ENDPOINT}: HTTP 500 InternalError"
    s.fabric.fail("inventory", FabricResourceBroken(f"fabric device 'gpu-0' is held back: {why}"))
    assert await s.attach() == {READY_CONDITION: "Attached"}
    (note,) = s.events(cases.BROKEN)
    assert f"GET {ENDPOINT}: HTTP 500" in note
    assert "gpu-0" not in s.holds


async def test_an_unreachable_fabric_is_an_event_while_it_is_waited_out(setup: Setup) -> None:
    s = setup
    down = FabricUnreachable("fabric GET /redfish/v1/: no answer within 10 s")
    s.fabric.fail("inventory", down, times=3)
    assert await s.attach() == {READY_CONDITION: "Attached"}
    (note,) = s.events(cases.UNREACHABLE)
    assert "the fabric manager is unreachable" in note and "GET /redfish/v1/" in note
    assert s.events("AttachFailed") == [] and "gpu-0" not in s.holds


async def test_a_broken_resource_past_the_budget_fails_the_claim_but_holds_nothing() -> None:
    s = Setup(budget=0.3)
    task = asyncio.create_task(s.recorder.run())
    try:
        broken = FabricApiError(502, "BadGateway", "no agent", "POST", CONNECTIONS)
        s.fabric.fail("attach", broken, times=10_000)
        assert await s.attach() == {FAILED_CONDITION: cases.BROKEN}
        (failed,) = s.events(cases.BROKEN)[-1:]
        assert "failed" in failed and f"POST {CONNECTIONS}: HTTP 502" in failed
        assert "gpu-0" not in s.holds
    finally:
        task.cancel()


async def test_a_refused_attach_fails_at_once_and_holds_the_device(setup: Setup) -> None:
    s = setup
    no = FabricAttachRefused(400, "ActionNotSupported", "hot-plug disabled", "POST", CONNECTIONS)
    s.fabric.fail("attach", no, times=10_000)
    assert await s.attach() == {FAILED_CONDITION: cases.REFUSED}
    (note,) = s.events(cases.REFUSED)
    print(note)
    assert note.startswith("attaching gpu-0 to node-a via adapter0 failed: the fabric refused")
    assert f"fabric POST {CONNECTIONS}: HTTP 400 ActionNotSupported: hot-plug disabled" in note
    assert "held out of the pool for 300s" in note
    assert s.holds.held() == {"gpu-0"} and s.fabric.attached == []
    assert len(s.fabric._failures["attach"]) == 10_000 - 1  # asked once, not retried
