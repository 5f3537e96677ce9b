"""Protobuf <-> model translation for the kubelet's DRA service.

The v1 and v1beta1 DRA protos are wire-identical except for v1's optional
``Device.share_id``, so one set of functions serves both: each takes the
generated ``*_pb2`` module of the version in use. The kubelet-facing rules
live here, in one place:

- every claim of the request gets an entry in the response (a claim the
  handler forgot gets an error entry rather than silently going missing);
- request names lose any ``/subrequest`` suffix (the kubelet matches devices
  to the claim's top-level requests);
- ``share_id`` is sent only where the proto has the field (v1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from driver.claims.model import ClaimRef, PreparedDevice, PrepareResult

log = logging.getLogger(__name__)

MISSING_RESULT = "internal error: the driver returned no result for this claim"


def claims_from_proto(claims: Iterable[Any]) -> list[ClaimRef]:
    """The request's claims as :class:`ClaimRef`, in request order, without
    duplicates (the kubelet never sends any, but a map key is unique anyway)."""
    seen: dict[str, ClaimRef] = {}
    for c in claims:
        seen.setdefault(c.uid, ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid))
    return list(seen.values())


def top_level_request(name: str) -> str:
    """``"gpu/large"`` -> ``"gpu"``: the kubelet wants the claim's request,
    not the subrequest of a prioritized list that was chosen."""
    return name.split("/", 1)[0]


def device_to_proto(pb2: ModuleType, device: PreparedDevice) -> Any:
    """One prepared device as ``pb2.Device``."""
    msg = pb2.Device(
        request_names=[top_level_request(n) for n in device.request_names],
        pool_name=device.pool_name,
        device_name=device.device_name,
        cdi_device_ids=list(device.cdi_device_ids),
    )
    if device.share_id is not None:
        if "share_id" in pb2.Device.DESCRIPTOR.fields_by_name:
            msg.share_id = device.share_id
        else:
            log.debug("dropping share_id of %s: %s has no such field", device.device_name, pb2)
    return msg


def prepare_response(
    pb2: ModuleType, claims: Iterable[ClaimRef], results: Mapping[str, PrepareResult]
) -> Any:
    """``pb2.NodePrepareResourcesResponse`` with exactly one entry per claim."""
    resp = pb2.NodePrepareResourcesResponse()
    for claim in claims:
        result = results.get(claim.uid, PrepareResult(error=MISSING_RESULT))
        entry = resp.claims[claim.uid]
        if result.error:
            entry.error = result.error
            continue
        entry.devices.extend(device_to_proto(pb2, d) for d in result.devices)
    return resp


def unprepare_response(
    pb2: ModuleType, claims: Iterable[ClaimRef], errors: Mapping[str, str]
) -> Any:
    """``pb2.NodeUnprepareResourcesResponse`` with exactly one entry per claim."""
    resp = pb2.NodeUnprepareResourcesResponse()
    for claim in claims:
        resp.claims[claim.uid].error = errors.get(claim.uid, MISSING_RESULT)
    return resp


def batch_failure(claims: Iterable[ClaimRef], exc: BaseException) -> dict[str, str]:
    """The same error message for every claim of a batch the handler failed as a whole."""
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return {c.uid: message for c in claims}


def devices_from_proto(devices: Iterable[Any]) -> tuple[PreparedDevice, ...]:
    """The reverse of :func:`device_to_proto`; used by tests and tools acting
    as the kubelet. ``share_id`` is ``None`` where unset or absent."""
    out = []
    for d in devices:
        has_share = "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id")
        share = d.share_id if has_share else None
        out.append(
            PreparedDevice(
                request_names=tuple(d.request_names),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=share,
            )
        )
    return tuple(out)
