"""Who a ResourceClaim is reserved for: its pods, or its PodGroup (KEP-5729).

Why this module exists: ``status.reservedFor`` used to name only pods, and
every reader kept the entries whose ``resource`` is ``pods``. With the
``DRAWorkloadResourceClaims`` gate (beta, off by default in 1.37) a claim
listed in a PodGroup's ``spec.resourceClaims`` is reserved for the group
instead (``apiGroup: scheduling.k8s.io``, ``resource: podgroups``): its
pods name the group in ``spec.schedulingGroup.podGroupName`` and never
appear in ``reservedFor`` (``k8s.io/dynamic-resource-allocation``
``resourceclaim.IsReservedForPod``). A reader that kept only pods saw such
a claim as held by nobody. This is the one place that reads the field, for
the preparer's log context and the ``kubectl patchbay`` views alike; it
never raises on a malformed claim (a claim a prepare fails on is still
logged, issue 17). Beside it, :func:`allocated_node`: the one node an
allocation is bound to, which the controller attaches to and the views show
for a device published without one (the per-domain fabric pools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POD_RESOURCE = "pods"  # core group: apiGroup is empty
POD_GROUP_API_GROUP = "scheduling.k8s.io"
POD_GROUP_RESOURCE = "podgroups"


@dataclass(frozen=True)
class Reservation:
    """The names in one claim's ``status.reservedFor``, by kind (in order)."""

    pods: tuple[str, ...] = ()
    pod_groups: tuple[str, ...] = ()
    pod_uids: tuple[str, ...] = ()  # the pods' UIDs, where every pod entry names one

    def __bool__(self) -> bool:
        return bool(self.pods or self.pod_groups)

    def labels(self) -> tuple[str, ...]:
        """Pods by name, each PodGroup as ``podgroup/<name>``."""
        return (*self.pods, *(f"podgroup/{g}" for g in self.pod_groups))


def reserved_for(claim: object) -> Reservation:
    """The pods and PodGroups ``claim`` (its JSON) is reserved for; empty on any odd shape."""
    status = claim.get("status") if isinstance(claim, Mapping) else None
    entries = status.get("reservedFor") if isinstance(status, Mapping) else None
    pods: list[str] = []
    uids: list[str] | None = []
    groups: list[str] = []
    for r in entries if isinstance(entries, list) else ():
        if not isinstance(r, Mapping) or not isinstance(r.get("name"), str):
            continue
        group, resource = r.get("apiGroup") or "", r.get("resource")
        if group == "" and resource == POD_RESOURCE:
            pods.append(r["name"])
            uid = r.get("uid")
            uids = [*uids, uid] if uids is not None and isinstance(uid, str) and uid else None
        elif group == POD_GROUP_API_GROUP and resource == POD_GROUP_RESOURCE:
            groups.append(r["name"])
    return Reservation(tuple(pods), tuple(groups), tuple(uids or ()))


def pods_of(claim: object) -> list[str] | None:
    """The UIDs of the pods ``claim`` is reserved for; None where they are not
    all known (no pod, a pod entry without its UID, a PodGroup)."""
    r = reserved_for(claim)
    if r.pod_groups or not r.pods or len(r.pod_uids) != len(r.pods):
        return None
    return sorted(set(r.pod_uids))


def more_pods(known: list[str] | None, claim: object) -> list[str] | None:
    """``known`` with the pods ``claim`` now names (another pod prepared with it)."""
    now = pods_of(claim)
    if known is None or now is None:
        return now
    return sorted(set(known) | set(now))


def allocated_node(allocation: Mapping[str, Any]) -> str:
    """The one node an allocation's ``nodeSelector`` names by ``metadata.name``
    (what the scheduler writes for a device that binds to a node), or ""."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ()
    for term in terms:
        for f in term.get("matchFields") or ():
            values = list(f.get("values") or [])
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return ""
