"""Protobuf <-> model translation of the kubelet's DRA calls, and the
servicer's failure isolation, without any socket."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from driver.claims.model import ClaimRef, Fetched, PreparedDevice, PrepareResult
from driver.health.model import DeviceHealth, HealthStatus
from plugin.proto import dra_v1_pb2, dra_v1beta1_pb2, health_v1alpha1_pb2
from plugin.servers import translate
from plugin.servers.dra import DraServicer
from plugin.servers.health import health_to_proto

A = ClaimRef(namespace="ns", name="a", uid="uid-a")
B = ClaimRef(namespace="ns", name="b", uid="uid-b")
GPU = PreparedDevice(
    request_names=("gpu/large", "nic"),
    pool_name="node-1",
    device_name="gpu-0",
    cdi_device_ids=("k8s.patchbay.dev/claim=uid-a-gpu-0",),
    share_id="share-7",
)


def _request(pb2: Any, *claims: ClaimRef) -> Any:
    return pb2.NodePrepareResourcesRequest(
        claims=[pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
    )


def test_claims_from_proto_keeps_order_and_fields() -> None:
    req = _request(dra_v1_pb2, B, A, B)
    assert translate.claims_from_proto(req.claims) == [B, A]


@pytest.mark.parametrize("name,want", [("gpu", "gpu"), ("gpu/large", "gpu"), ("a/b/c", "a")])
def test_subrequest_suffix_dropped(name: str, want: str) -> None:
    assert translate.top_level_request(name) == want


def test_v1_device_carries_share_id_and_top_level_requests() -> None:
    msg = translate.device_to_proto(dra_v1_pb2, GPU)
    assert list(msg.request_names) == ["gpu", "nic"]
    assert msg.HasField("share_id") and msg.share_id == "share-7"
    assert list(msg.cdi_device_ids) == ["k8s.patchbay.dev/claim=uid-a-gpu-0"]
    back = translate.devices_from_proto([msg])[0]
    assert back.share_id == "share-7" and back.device_name == "gpu-0"


def test_v1_share_id_unset_when_none() -> None:
    msg = translate.device_to_proto(dra_v1_pb2, PreparedDevice(("gpu",), "p", "d", ()))
    assert not msg.HasField("share_id")
    assert translate.devices_from_proto([msg])[0].share_id is None


def test_v1beta1_has_no_share_id_and_drops_it() -> None:
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    msg = translate.device_to_proto(dra_v1beta1_pb2, GPU)
    assert msg.device_name == "gpu-0"
    assert translate.devices_from_proto([msg])[0].share_id is None


def test_v1_share_id_is_field_5_on_the_wire() -> None:
    field = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert field.number == 5
    # v1beta1 decodes a v1 Device and ignores the unknown field 5.
    wire = translate.device_to_proto(dra_v1_pb2, GPU).SerializeToString()
    assert dra_v1beta1_pb2.Device.FromString(wire).device_name == "gpu-0"


def test_prepare_response_has_entry_per_claim_even_if_handler_forgot() -> None:
    results = {A.uid: PrepareResult(devices=(GPU,)), "other": PrepareResult(error="x")}
    resp = translate.prepare_response(dra_v1_pb2, [A, B], results)
    assert set(resp.claims) == {A.uid, B.uid}
    assert resp.claims[A.uid].error == ""
    assert [d.device_name for d in resp.claims[A.uid].devices] == ["gpu-0"]
    assert resp.claims[B.uid].error == translate.MISSING_RESULT


def test_prepare_error_entry_has_no_devices() -> None:
    results = {A.uid: PrepareResult(devices=(GPU,), error="boom")}
    resp = translate.prepare_response(dra_v1_pb2, [A], results)
    assert resp.claims[A.uid].error == "boom"
    assert len(resp.claims[A.uid].devices) == 0


def test_unprepare_response_per_claim() -> None:
    resp = translate.unprepare_response(dra_v1beta1_pb2, [A, B], {A.uid: ""})
    assert resp.claims[A.uid].error == ""
    assert resp.claims[B.uid].error == translate.MISSING_RESULT


class _Raising:
    async def read(self, claims: Sequence[ClaimRef]) -> Fetched:
        return {}

    async def prepare(
        self, claims: Sequence[ClaimRef], fetched: Fetched | None = None
    ) -> Mapping[str, PrepareResult]:
        raise RuntimeError("nvml exploded")

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        raise RuntimeError("checkpoint unreadable")


@pytest.mark.parametrize("pb2", [dra_v1_pb2, dra_v1beta1_pb2])
async def test_batch_exception_becomes_per_claim_errors(pb2: Any) -> None:
    servicer = DraServicer(_Raising(), pb2)
    resp = await servicer.NodePrepareResources(_request(pb2, A, B), None)
    assert set(resp.claims) == {A.uid, B.uid}
    for uid in (A.uid, B.uid):
        assert resp.claims[uid].error == "RuntimeError: nvml exploded"
    unreq = pb2.NodeUnprepareResourcesRequest(claims=_request(pb2, A, B).claims)
    uresp = await servicer.NodeUnprepareResources(unreq, None)
    assert {uid: e.error for uid, e in uresp.claims.items()} == {
        A.uid: "RuntimeError: checkpoint unreadable",
        B.uid: "RuntimeError: checkpoint unreadable",
    }


class _Half:
    """Prepares A, fails B; unprepares both."""

    async def read(self, claims: Sequence[ClaimRef]) -> Fetched:
        return {}

    async def prepare(
        self, claims: Sequence[ClaimRef], fetched: Fetched | None = None
    ) -> Mapping[str, PrepareResult]:
        return {A.uid: PrepareResult(devices=(GPU,)), B.uid: PrepareResult(error="no such GPU")}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {c.uid: "" for c in claims}


def _call_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "plugin.servers.dra" and r.levelno == logging.INFO
    ]


async def test_call_line_is_written_after_the_answer(caplog: pytest.LogCaptureFixture) -> None:
    """One info line per call, with its count, failures and time, scheduled
    for after the servicer returned (the server writes the answer in that
    same step); a claim's failure is logged at once."""
    caplog.set_level(logging.INFO)
    servicer = DraServicer(_Half(), dra_v1_pb2)
    resp = await servicer.NodePrepareResources(_request(dra_v1_pb2, A, B), None)
    assert resp.claims[B.uid].error == "no such GPU"
    assert _call_lines(caplog) == []  # not yet: the answer is still to be written
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["prepare of claim uid-b failed: no such GPU"]
    await asyncio.sleep(0)
    [line] = _call_lines(caplog)
    assert re.fullmatch(
        r"prepared 2 claim\(s\) in \d+\.\d\d ms, 1 failed: \['uid-a', 'uid-b'\]", line
    )
    unreq = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[_request(dra_v1_pb2, A).claims[0]])
    await servicer.NodeUnprepareResources(unreq, None)
    assert len(_call_lines(caplog)) == 1
    await asyncio.sleep(0)
    assert re.fullmatch(
        r"unprepared 1 claim\(s\) in \d+\.\d\d ms, 0 failed: \['uid-a'\]", _call_lines(caplog)[1]
    )


def test_health_to_proto() -> None:
    devices = [
        DeviceHealth("node-1", "gpu-0", HealthStatus.HEALTHY, 1700000000, 30),
        DeviceHealth("node-1", "gpu-1", HealthStatus.UNHEALTHY, 1700000001, 0, "XID 79"),
    ]
    resp = health_to_proto(devices)
    assert [d.device.device_name for d in resp.devices] == ["gpu-0", "gpu-1"]
    assert resp.devices[0].health == health_v1alpha1_pb2.HEALTHY
    assert resp.devices[0].health_check_timeout_seconds == 30
    assert resp.devices[1].health == health_v1alpha1_pb2.UNHEALTHY
    assert resp.devices[1].message == "XID 79"
    assert resp.devices[1].last_updated_time == 1700000001
