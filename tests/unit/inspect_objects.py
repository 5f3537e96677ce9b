"""Recorded API objects for the ``kubectl patchbay`` claims and fabric views.

The fabric pool as the controller publishes it (``driver.controller.pool.devices``):
one variant per (device, node, adapter) with ``fabricDevice``,
``fabricAdapter``, the adapter's ``pcieRoot`` and the binding conditions,
one counter per physical device in a counter-only slice; claims as the
scheduler writes them (binding conditions copied into the result,
``allocationTimestamp``) with the controller's ``status.devices``
conditions; core/v1 Events as the kubelet and the scheduler record them.
"""

from __future__ import annotations

from typing import Any

from driver.fabric_devices.naming import FAILED_CONDITION
from tests.unit.inspect_node_objects import attrs

JsonObj = dict[str, Any]
POOL = "fabric"
NODES = ("node-a", "node-b")
ROOTS = {"adapter0": "pci0000:15", "adapter1": "pci0000:85"}
# device id -> (type, switch, adapter, identity)
DEVICES = {
    "gpu-0": ("gpu", "sw0", "adapter0", "GPU-f0"),
    "gpu-1": ("gpu", "sw0", "adapter0", "GPU-f1"),
    "nic-0": ("vf", "sw1", "adapter1", "aa:bb:cc:00:00:01"),
}


def variant_name(dev: str, node: str, adapter: str) -> str:
    return f"f{dev}-{node}-{adapter}"


def variant(dev: str, node: str) -> JsonObj:
    kind, switch, adapter, identity = DEVICES[dev]
    key = "uuid" if kind == "gpu" else "macAddress"
    a = attrs(
        type=kind,
        attachment="fabric",
        fabricDevice=dev,
        fabricSwitch=switch,
        fabricAdapter=adapter,
        pcieRoot=ROOTS[adapter],
        productName="H100",
        **{key: identity},
    )
    return {
        "name": variant_name(dev, node, adapter),
        "nodeName": node,
        "attributes": a,
        "bindsToNode": True,
        "bindingConditions": ["FabricDeviceReady"],
        "bindingFailureConditions": [FAILED_CONDITION],
        "consumesCounters": [{"counterSet": "fabric-devices-0", "counters": {dev: {"value": "1"}}}],
    }


def fabric_slices(offered: tuple[str, ...] = ("gpu-0", "gpu-1", "nic-0")) -> list[JsonObj]:
    spec = {"driver": "patchbay.dev", "perDeviceNodeSelection": True, "pool": {"name": POOL}}
    counters = {"name": "fabric-devices-0", "counters": {d: {"value": "1"} for d in DEVICES}}
    out = [{"metadata": {"name": "fabric-c"}, "spec": spec | {"sharedCounters": [counters]}}]
    for node in NODES:
        devices = [variant(d, node) for d in offered]
        out.append({"metadata": {"name": f"fabric-{node}"}, "spec": spec | {"devices": devices}})
    return out


def fabric_claim(
    name: str, dev: str, node: str, conditions: list[JsonObj] | None = None, pod: str = ""
) -> JsonObj:
    adapter = DEVICES[dev][2]
    device = variant_name(dev, node, adapter)
    result = {
        "request": "gpu",
        "driver": "patchbay.dev",
        "pool": POOL,
        "device": device,
        "bindingConditions": ["FabricDeviceReady"],
        "bindingFailureConditions": [FAILED_CONDITION],
    }
    status: JsonObj = {
        "allocation": {
            "devices": {"results": [result]},
            "allocationTimestamp": "2026-12-01T10:00:00Z",
        }
    }
    if conditions is not None:
        status["devices"] = [
            {"driver": "patchbay.dev", "pool": POOL, "device": device, "conditions": conditions}
        ]
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": "u"}]
    meta = {"namespace": "team", "name": name, "uid": f"uid-{name}"}
    return {"metadata": meta, "spec": {"devices": {"requests": []}}, "status": status}


def condition(kind: str, reason: str, message: str, at: str) -> JsonObj:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
    }


def pending_claim(name: str, owner_pod: str) -> JsonObj:
    meta = {
        "namespace": "team",
        "name": name,
        "uid": f"uid-{name}",
        "ownerReferences": [{"kind": "Pod", "name": owner_pod, "uid": "p"}],
    }
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}
    return {"metadata": meta, "spec": {"devices": {"requests": [request]}}, "status": {}}


def event(kind: str, name: str, reason: str, message: str, **times: Any) -> JsonObj:
    e: JsonObj = {
        "metadata": {"name": f"{name}.{reason}", "namespace": "team"},
        "involvedObject": {"kind": kind, "namespace": "team", "name": name},
        "type": times.pop("type", "Warning"),
        "reason": reason,
        "message": message,
    }
    return e | times


def node(name: str, attached: dict[str, str] | None = None, busy: tuple[str, ...] = ()) -> JsonObj:
    import json

    report: JsonObj = {"adapters": ROOTS, "gpus": attached or {}}
    if busy:
        report["busy"] = list(busy)
    annotations = {"patchbay.dev/fabric": json.dumps(report)}
    return {"metadata": {"name": name, "annotations": annotations}}
