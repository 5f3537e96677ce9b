"""What the lease keeper's Events say, and about which objects.

Why: an Event is where a user whose pod is evicted, or an operator whose
policy does nothing, looks first; its words name the devices, since when,
the policy and field, and what happens next. Kept apart from the keeper,
which decides when to say them. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from driver.controller.leases.idle import IdleDue
from driver.controller.leases.policies import IdleRule, Terms
from driver.kube.events import ObjectRef
from driver.leaseterms import (
    Lease,
    format_duration,
    owner_pod,
    stamp,
    users,
)


def claim_ref(claim: Mapping[str, Any]) -> ObjectRef:
    return ObjectRef.of(claim, "ResourceClaim", "resource.k8s.io/v1")


def refs(claim: Mapping[str, Any]) -> list[ObjectRef]:
    """The claim and the pods using it."""
    ns = str((claim.get("metadata") or {}).get("namespace") or "")
    pods = [ObjectRef("Pod", name, ns, uid) for name, uid in users(claim)]
    return [claim_ref(claim), *pods]


def ended(lease: Lease) -> str:
    return f"the device lease of {lease.holder or 'unknown'} ended at {stamp(lease.expiry or 0.0)}"


def idle(due: IdleDue, holder: str) -> str:
    """Which devices are idle, whose, since when, and the rules that say so."""
    rules = ", ".join(f"DeviceLeasePolicy {r.policy} idle.for {format_duration(r.length)}"
                      for r in due.rules)  # fmt: skip
    below = due.state.threshold
    node = f"below {below:g}% (as the node measures)" if below is not None else "idle"
    return (f"devices {due.state.devices()} of {holder or 'unknown'} {node} since "
            f"{stamp(due.state.since)} ({rules}, idle.action {due.rules[0].action})")  # fmt: skip


def taking(claim: Mapping[str, Any], terms: Terms) -> str:
    """What taking the devices back does: the evictions and the claim's fate."""
    grace = f"{terms.grace}s" if terms.grace is not None else "the pods' own"
    end = ("; the claim is deleted, never handed out again" if not owner_pod(claim) else
           "; the pod's next claim is a new lease")  # fmt: skip
    return f"evicting {len(users(claim))} pod(s) (grace period {grace}){end}"


def would_evict(claim: Mapping[str, Any], what: str) -> str:
    pods = users(claim)
    names = ", ".join(name for name, _ in pods) or "none"
    end = "; the claim would be deleted" if not owner_pod(claim) else ""
    return (f"audit only (spec.audit): {what}; {len(pods)} pod(s) would be evicted "
            f"({names}){end}; nothing is done")  # fmt: skip


def unprovable(rule: IdleRule, node: float | None, claim: str) -> str:
    seen = f"{node:g}%" if node is not None else "not stated"
    return (f"spec.idle.utilizationBelowPercent {rule.threshold:g} is below the idle "
            f"threshold the node measures against ({seen}, kubeletPlugin.idleThreshold) for "
            f"claim {claim}: its idleness cannot be shown, so spec.idle.action {rule.action} "
            f"is not taken")  # fmt: skip
