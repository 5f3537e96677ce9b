"""Device-seconds held and idle (issue 37), with an injected monotonic clock:
each pass credits the time since the previous one to the devices the
previous pass saw, per namespace, holder and device class; idle seconds
only while the node reports the device ``Idle=True``."""

from __future__ import annotations

from typing import Any

from driver.controller.leases.usage import DeviceSeconds, holdings, seconds_to_expiry
from driver.idleterms import IDLE, idle_message
from driver.leaseterms import (
    AUDIT_EXPIRED,
    EXPIRED,
    EXPIRY,
    HOLDER,
    PHASE,
    RECLAIMED,
    START,
    WARNED,
    stamp,
)
from driver.metrics import CONTROLLER as REGISTRY

T0 = 1_796_083_200.0


def claim(ns: str, holder: str, devices: dict[str, bool], cls: str = "gpu.patchbay.dev",
          first: bool = False) -> dict[str, Any]:  # fmt: skip
    """A claim holding ``devices`` (name: reported idle) of one request."""
    request: dict[str, Any]
    if first:  # the class is a firstAvailable choice's
        request = {"name": "g", "firstAvailable": [{"name": "big", "deviceClassName": cls}]}
        name = "g/big"
    else:
        request, name = {"name": "g", "exactly": {"deviceClassName": cls}}, "g"
    idle = {"type": IDLE, "status": "True", "message": idle_message(5, 60, stamp(T0), 1),
            "lastTransitionTime": stamp(T0 + 60)}  # fmt: skip
    notes = {HOLDER: holder} if holder else {}
    return {
        "metadata": {"namespace": ns, "name": "c", "annotations": notes},
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": name, "driver": "patchbay.dev", "pool": "n", "device": d}
                for d in devices] + [{"request": name, "driver": "other.dev", "pool": "n",
                                      "device": "x"}]}},
            "devices": [{"driver": "patchbay.dev", "pool": "n", "device": d,
                         "conditions": [idle] if low else []} for d, low in devices.items()],
        },
    }  # fmt: skip


def seconds(kind: str, ns: str, holder: str, cls: str) -> float:
    labels = {"claim_namespace": ns, "holder": holder, "class": cls}
    return REGISTRY.get_sample_value(f"patchbay_device_seconds_{kind}_total", labels) or 0.0


def test_holdings_count_our_devices_by_namespace_holder_and_class() -> None:
    claims = [
        claim("usage-a", "alice", {"gpu-0": True, "gpu-1": False}),
        claim("usage-a", "alice", {"gpu-2": True}, cls="mig.patchbay.dev", first=True),
        claim("usage-a", "", {"gpu-3": False}),
        {"metadata": {"namespace": "usage-a", "name": "pending"}, "spec": {}},  # not allocated
    ]
    assert holdings(claims) == {
        ("usage-a", "alice", "gpu.patchbay.dev"): (2, 1),
        ("usage-a", "alice", "mig.patchbay.dev"): (1, 1),
        ("usage-a", "unknown", "gpu.patchbay.dev"): (1, 0),
    }


def test_device_seconds_add_up_between_passes_from_what_each_pass_saw() -> None:
    usage = DeviceSeconds()
    gpu = "gpu.patchbay.dev"
    before = (seconds("allocated", "usage-b", "bob", gpu), seconds("idle", "usage-b", "bob", gpu))
    two_busy = claim("usage-b", "bob", {"gpu-0": False, "gpu-1": False})
    one_idle = claim("usage-b", "bob", {"gpu-0": True, "gpu-1": False})
    usage.advance(100.0, [two_busy])  # the first pass: nothing to credit yet
    assert seconds("allocated", "usage-b", "bob", gpu) == before[0]
    usage.advance(130.0, [one_idle])  # 30 s of two busy devices
    usage.advance(190.0, [])  # 60 s of two devices, one of them idle; then released
    usage.advance(1000.0, [])  # nothing held: nothing counts
    assert seconds("allocated", "usage-b", "bob", gpu) == before[0] + 2 * 30 + 2 * 60
    assert seconds("idle", "usage-b", "bob", gpu) == before[1] + 60


def test_seconds_to_expiry_only_of_running_leases() -> None:
    def leased(name: str, expiry: float | None, phase: str = "") -> dict[str, Any]:
        notes = {PHASE: phase} if phase else {}
        if expiry is not None:
            notes.update({START: stamp(T0 - 60), EXPIRY: stamp(expiry)})
        return {"metadata": {"namespace": "exp", "name": name, "annotations": notes}}

    claims = [
        leased("active", T0 + 3600), leased("warned", T0 + 30, WARNED),
        leased("overdue", T0 - 5),  # the controller has not acted yet
        leased("expired", T0 - 60, EXPIRED), leased("reclaimed", T0 + 60, RECLAIMED),
        leased("audited", T0 - 60, AUDIT_EXPIRED), leased("unstamped", None),
    ]  # fmt: skip
    got = {tuple(labels): value for labels, value in seconds_to_expiry(claims, T0)}
    assert got == {("exp", "active"): 3600, ("exp", "warned"): 30, ("exp", "overdue"): -5}
