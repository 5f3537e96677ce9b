"""The Events the controller records, on the objects people look at.

Why: "why is my pod's fabric GPU not there?" is answered by
``kubectl describe resourceclaim`` (attach started, attached, attach failed
with the fabric's message, detached), ``kubectl describe node`` (a fabric
adapter the node no longer reports, or the fabric no longer lists) and
``kubectl describe lease`` of the controller's leader Lease (a broken fabric
resource, ``driver.controller.broken``). Every
reason the controller records is named here (docs/events.md lists them);
the writing, deduplication and rate limit are ``driver.kube.events``.

Concurrency: called on the controller's asyncio loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from driver.controller.claims import FabricAllocation
from driver.controller.pool.variant import Variant
from driver.fabric_devices.naming import NodeFabric
from driver.kube.events import EventRecorder, ObjectRef

CONTROLLER = "patchbay.dev/controller"  # the reportingController of our Events
ATTACHING = "Attaching"
ATTACHED = "Attached"
ATTACH_FAILED = "AttachFailed"
# The three cases of fabric trouble an attach meets (driver.controller.attach.cases).
FABRIC_UNREACHABLE = "FabricUnreachable"
FABRIC_RESOURCE_BROKEN = "FabricResourceBroken"
FABRIC_ATTACH_REFUSED = "FabricAttachRefused"
ADAPTER_FULL = "FabricAdapterFull"  # the node's adapter has no room (pool.room)
DETACHED = "Detached"
DETACH_FAILED = "DetachFailed"
ADAPTER_GONE = "FabricAdapterGone"
SPARE_ATTACHED = "SpareAttached"
SPARE_ATTACH_FAILED = "SpareAttachFailed"
SPARE_RELEASED = "SpareReleased"
SPARE_TAKEN = "SpareTaken"
LEASE_STARTED = "LeaseStarted"
LEASE_EXPIRING = "LeaseExpiring"
LEASE_EXPIRED = "LeaseExpired"
LEASE_EVICTION_BLOCKED = "LeaseEvictionBlocked"
LEASE_EXTENDED = "LeaseExtended"
LEASE_EXTENSION_REFUSED = "LeaseExtensionRefused"
DEVICES_IDLE = "DevicesIdle"
IDLE_RECLAIMED = "IdleReclaimed"
LEASE_WOULD_EVICT = "LeaseWouldEvict"
IDLE_THRESHOLD_BELOW_NODE = "IdleThresholdBelowNode"

# A fabric GPU its node found failed (docs/health.md, "The fabric path").
FABRIC_DEVICE_UNHEALTHY = "FabricDeviceUnhealthy"
FABRIC_DEVICE_HELD_OUT = "FabricDeviceHeldOut"
FABRIC_DEVICE_RETURNED = "FabricDeviceReturned"

REACH_LABEL_WRONG = "FabricReachLabelWithoutReach"
REACH_LABEL_MISSING = "FabricReachLabelMissing"


def claim_ref(a: FabricAllocation) -> ObjectRef:
    return ObjectRef("ResourceClaim", a.name, a.namespace, a.claim_uid, "resource.k8s.io/v1")


def node_ref(nodes: Mapping[str, Mapping[str, Any]], name: str) -> ObjectRef:
    """A Node's reference (with its uid when the Node is known: ``kubectl
    describe node`` selects its Events by uid)."""
    node = nodes.get(name)
    return ObjectRef.of(node, "Node") if node is not None else ObjectRef("Node", name)


def gone_adapters(
    before: Mapping[str, NodeFabric],
    listed_before: Iterable[tuple[str, str]],
    after: Mapping[str, NodeFabric],
    listed_after: Iterable[tuple[str, str]],
    nodes: Mapping[str, Any],
) -> list[tuple[str, str, str]]:
    """``(node, adapter, why)`` for each adapter of a still existing Node that
    its report or the fabric's inventory (``(node, adapter)`` pairs) had in
    the previous pass and has no more."""
    out = []
    for node, report in sorted(before.items()):
        now = after.get(node)
        for adapter, root in sorted(report.adapters.items()):
            if node in nodes and (now is None or adapter not in now.adapters):
                out.append((node, adapter, f"the node reports adapter {adapter} ({root}) no more"))
    still = set(listed_after)
    for node, adapter in sorted(set(listed_before) - still):
        if node in nodes:
            out.append((node, adapter, f"the fabric no longer lists adapter {adapter}"))
    return out


class ControllerEvents:
    """The controller's Events; a no-op without a recorder (unit tests)."""

    def __init__(self, recorder: EventRecorder | None) -> None:
        self.recorder = recorder

    def attaching(self, a: FabricAllocation, v: Variant) -> None:
        if self.recorder is not None:
            note = f"attaching fabric device {v.device_id} to node {v.node} via {v.adapter}"
            self.recorder.normal(claim_ref(a), ATTACHING, "Attach", note)

    def attached(self, a: FabricAllocation, message: str) -> None:
        if self.recorder is not None:
            self.recorder.normal(claim_ref(a), ATTACHED, "Attach", message)

    def attach_failed(
        self, a: FabricAllocation, v: Variant, why: str, reason: str = ATTACH_FAILED
    ) -> None:
        """The attach failed (``FabricDeviceFailed``); ``reason``: its case."""
        if self.recorder is not None:
            note = f"attaching {v.device_id} to {v.node} via {v.adapter} failed: {why}"
            self.recorder.warning(claim_ref(a), reason, "Attach", note)

    def attach_trouble(self, a: FabricAllocation, v: Variant, reason: str, why: str) -> None:
        """The attach meets fabric trouble it waits out (``reason``: its case)."""
        if self.recorder is not None:
            note = f"attaching {v.device_id} to {v.node} via {v.adapter}: {why}"
            self.recorder.warning(claim_ref(a), reason, "Attach", note)

    def device_in_doubt(self, a: FabricAllocation, device_id: str, why: str) -> None:
        """A read held back the device claim ``a`` holds (kept as last seen)."""
        if self.recorder is not None:
            note = (
                f"fabric device {device_id} is in doubt: {why}; kept as last seen "
                "(published, attached: a partial read detaches and releases nothing)"
            )
            self.recorder.warning(claim_ref(a), FABRIC_RESOURCE_BROKEN, "WatchFabric", note)

    def resource_broken(self, lease: ObjectRef, uri: str, why: str, held: list[str]) -> None:
        """A fabric read could not use ``uri`` (``driver.controller.broken``)."""
        if self.recorder is not None:
            doubt = f"holds back {', '.join(held)}" if held else "holds back no device"
            note = (f"fabric resource {uri} is broken: {why}; {doubt} (kept as last seen); "
                    "the rest of the fabric is offered and attached")  # fmt: skip
            self.recorder.warning(lease, FABRIC_RESOURCE_BROKEN, "WatchFabric", note)

    def detached(self, regarding: ObjectRef, device_id: str, node: str) -> None:
        if self.recorder is not None:
            note = f"fabric device {device_id} detached from node {node}"
            self.recorder.normal(regarding, DETACHED, "Detach", note)

    def detach_failed(self, regarding: ObjectRef, device_id: str, why: str) -> None:
        if self.recorder is not None:
            note = f"detaching fabric device {device_id} failed (retried with backoff): {why}"
            self.recorder.warning(regarding, DETACH_FAILED, "Detach", note)

    def fabric_health(self, regarding: ObjectRef, reason: str, note: str) -> None:
        """A step of a failed fabric device (``FABRIC_DEVICE_*``; returned is Normal)."""
        if self.recorder is not None:
            if reason == FABRIC_DEVICE_RETURNED:
                self.recorder.normal(regarding, reason, "FabricHealth", note)
            else:
                self.recorder.warning(regarding, reason, "FabricHealth", note)

    def spare_attached(self, node: ObjectRef, v: Variant) -> None:
        if self.recorder is not None:
            note = f"fabric device {v.device_id} attached via {v.adapter} as a warm spare"
            self.recorder.normal(node, SPARE_ATTACHED, "Spare", note)

    def spare_failed(self, node: ObjectRef, v: Variant, why: str) -> None:
        if self.recorder is not None:
            note = f"attaching {v.device_id} via {v.adapter} as a warm spare failed: {why}"
            self.recorder.warning(node, SPARE_ATTACH_FAILED, "Spare", note)

    def spare_released(self, node: ObjectRef, device_id: str, why: str) -> None:
        if self.recorder is not None:
            note = f"warm spare {device_id} released ({why}): detaching it"
            self.recorder.normal(node, SPARE_RELEASED, "Spare", note)

    def spare_taken(self, a: FabricAllocation, v: Variant) -> None:
        if self.recorder is not None:
            note = f"took warm spare {v.device_id} on node {v.node}: no attach to wait for"
            self.recorder.normal(claim_ref(a), SPARE_TAKEN, "Allocate", note)

    def adapter_gone(self, node: ObjectRef, adapter: str, why: str) -> None:
        if self.recorder is not None:
            note = f"fabric adapter {adapter} gone: {why}; its devices leave this node's pool"
            self.recorder.warning(node, ADAPTER_GONE, "WatchFabric", note)

    def lease_started(self, claim: ObjectRef, note: str) -> None:
        if self.recorder is not None:
            self.recorder.normal(claim, LEASE_STARTED, "Lease", note)

    def lease_expiring(self, regarding: Iterable[ObjectRef], note: str) -> None:
        """On the claim and each pod using it."""
        if self.recorder is not None:
            for ref in regarding:
                self.recorder.warning(ref, LEASE_EXPIRING, "Lease", note)

    def lease_expired(self, regarding: Iterable[ObjectRef], note: str) -> None:
        if self.recorder is not None:
            for ref in regarding:
                self.recorder.warning(ref, LEASE_EXPIRED, "Evict", note)

    def eviction_blocked(self, regarding: Iterable[ObjectRef], note: str) -> None:
        if self.recorder is not None:
            for ref in regarding:
                self.recorder.warning(ref, LEASE_EVICTION_BLOCKED, "Evict", note)

    def lease_extended(self, claim: ObjectRef, note: str) -> None:
        if self.recorder is not None:
            self.recorder.normal(claim, LEASE_EXTENDED, "Extend", note)

    def extension_refused(self, claim: ObjectRef, note: str) -> None:
        if self.recorder is not None:
            self.recorder.warning(claim, LEASE_EXTENSION_REFUSED, "Extend", note)

    def devices_idle(self, regarding: Iterable[ObjectRef], note: str) -> None:
        if self.recorder is not None:
            for ref in regarding:
                self.recorder.warning(ref, DEVICES_IDLE, "Idle", note)

    def idle_reclaimed(self, regarding: Iterable[ObjectRef], note: str) -> None:
        if self.recorder is not None:
            for ref in regarding:
                self.recorder.warning(ref, IDLE_RECLAIMED, "Evict", note)

    def would_evict(self, regarding: Iterable[ObjectRef], note: str) -> None:
        """Audit mode: what expiry or an idle reclaim would do, done instead of it."""
        if self.recorder is not None:
            for ref in regarding:
                self.recorder.warning(ref, LEASE_WOULD_EVICT, "Audit", note)

    def idle_threshold_below_node(self, policy: ObjectRef, note: str) -> None:
        if self.recorder is not None:
            self.recorder.warning(policy, IDLE_THRESHOLD_BELOW_NODE, "Idle", note)

    def reach_label(self, node: ObjectRef, labelled: bool, note: str) -> None:
        if self.recorder is not None:
            reason = REACH_LABEL_WRONG if labelled else REACH_LABEL_MISSING
            self.recorder.warning(node, reason, "PublishFabricPool", note)
