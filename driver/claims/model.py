"""The plugin-facing model of a kubelet call.

The gRPC layer in ``plugin/`` translates protobuf messages into these types
and back, so the rest of patchbay never sees generated code. One kubelet call
carries many claims; each gets its own result so one bad claim never fails
the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from driver.kube.reservations import reserved_for


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it: only namespace, name and UID."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One device prepared for a claim, as reported back to the kubelet."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    """The outcome for one claim: devices on success, a message on failure."""

    devices: tuple[PreparedDevice, ...] = field(default_factory=tuple)
    error: str = ""


# What ``ClaimHandler.read`` found: a claim's UID -> the object read, or the
# exception its read raised (kept for that claim's result).
Fetched = Mapping[str, Mapping[str, Any] | BaseException]


class ClaimHandler(Protocol):
    """What the gRPC servicer calls. Implementations never raise for a
    per-claim problem: it goes into that claim's result."""

    async def read(self, claims: Sequence[ClaimRef]) -> Fetched:
        """What ``prepare`` needs from the API, read before any lock is taken
        (a slow read never holds up other calls); never raises per claim."""
        ...

    async def prepare(
        self, claims: Sequence[ClaimRef], fetched: Fetched | None = None
    ) -> Mapping[str, PrepareResult]:
        """Prepare every claim (with what ``read`` returned, or reading
        itself); the result maps each claim UID to its outcome."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Unprepare every claim; the result maps each claim UID to an error
        message, empty on success."""
        ...


def log_fields(
    ref: ClaimRef, claim: object = None, result: PrepareResult | None = None
) -> dict[str, str]:
    """A claim's log context (``driver.logconfig``): the claim, the pods or
    PodGroup its status reserves it for (when ``claim`` is the object read),
    its devices. A claim reserved for a PodGroup names no pod (KEP-5729): the
    group goes into ``pod_group``."""
    out = {"claim": f"{ref.namespace}/{ref.name}", "claim_uid": ref.uid}
    # any claim a prepare fails on is logged: reserved_for never raises on its shape (issue 17)
    reservation = reserved_for(claim)
    if reservation.pods:
        out["pod"] = ",".join(f"{ref.namespace}/{p}" for p in reservation.pods)
    if reservation.pod_groups:
        out["pod_group"] = ",".join(f"{ref.namespace}/{g}" for g in reservation.pod_groups)
    if result is not None and result.devices:
        out["device"] = ",".join(d.device_name for d in result.devices)
    return out
