"""Reach domains: which nodes can use which fabric devices, and the labels that say so.

Why a module: the per-domain pool (``driver.controller.pool.domain_pool``)
publishes each device once and lets the scheduler keep reach, with a
slice-level ``nodeSelector`` on a Node label per domain. What a domain is,
its label, which labelled Nodes its devices' adapters do not reach (cut out
of the selector), and which Nodes are labelled wrongly or not at all (the
Events that say so) are decided here, from the fabric inventory, the nodes'
reports and the Nodes' labels. The controller never writes those labels:
provisioning does (docs/fabric.md, "Reach labels").

A *reach domain* is a connected part of a fabric: devices joined through the
host adapters that reach them (a device and an adapter are joined when the
fabric lists the adapter among the device's reach, across switches as
``driver.fabricclient.reach`` found it). It is named after its fabric and
its first switch, which is what provisioning knows of the cabling. A node
*reaches* a device when one of its adapters that reaches the device is in
the node's own report (the plugin saw that adapter: it has a root). Pure
functions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.fabric_devices.naming import REACH_LABEL_PREFIX, NodeFabric
from driver.fabricclient.model import FabricDevice, FabricInventory

LABEL_PREFIX = REACH_LABEL_PREFIX  # its one owner: driver.fabric_devices.naming
# The attribute that names a device's reach domain (domain pools) or the one an
# adapter is cabled into (adapter pools): a pairing claim matches them.
DOMAIN_ATTRIBUTE = "fabricDomain"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
MAX_NAME = 63  # a label's name part, and a DNS label of the pool's name


@dataclass(frozen=True)
class Domain:
    """One reach domain: its name and its devices (ids, sorted)."""

    name: str
    devices: tuple[str, ...]

    @property
    def label(self) -> str:
        return LABEL_PREFIX + self.name


@dataclass(frozen=True)
class LabelFinding:
    """A Node whose reach label disagrees with its adapters: ``labelled`` True
    for a label without reach (the node is cut out), False for reach without
    the label (the node gets none of the domain's devices)."""

    node: str
    domain: str
    labelled: bool

    def note(self) -> str:
        label = LABEL_PREFIX + self.domain
        if self.labelled:
            return (
                f"node carries label {label} but none of its reported fabric adapters "
                f"reaches fabric domain {self.domain}: no device of it is offered here"
            )
        return (
            f"node's fabric adapters reach fabric domain {self.domain}, but the node lacks "
            f"label {label}: none of its devices is offered here until it is set"
        )


def domain_name(fabric: str, switch: str, taken: Iterable[str] = ()) -> str:
    """``<fabric>.<switch>`` as a lower-case DNS name of at most 63 characters
    (hashed when it cannot be one); ``taken``: names already given, which a
    second domain on the same first switch (zones) does not reuse."""
    raw = f"{fabric}.{switch}".lower()
    name = re.sub(r"[^a-z0-9.-]+", "-", raw).strip("-.")
    if not name or len(name) > MAX_NAME or not _NAME.match(name):
        name = "d-" + hashlib.sha256(raw.encode()).hexdigest()[:16]
    base, n = name, 1
    while name in set(taken):
        n += 1
        name = f"{base[: MAX_NAME - 4]}-{n}"
    return name


def reach_domains(inventory: FabricInventory) -> list[Domain]:
    """The inventory's devices (those with an identity) in reach domains, by name."""
    devices = sorted((d for d in inventory.devices if d.identity), key=lambda d: d.id)
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for d in devices:
        for a in d.adapters:
            parent[root(f"a:{a.fabric}/{a.endpoint}")] = root(f"d:{d.id}")
    groups: dict[str, list[FabricDevice]] = {}
    for d in devices:
        groups.setdefault(root(f"d:{d.id}"), []).append(d)
    # Named in a stable order: by fabric, first switch, first device.
    first = {id(g): min(x.switch for x in g) for g in groups.values()}
    ordered = sorted(groups.values(), key=lambda g: (g[0].fabric, first[id(g)], g[0].id))
    out: list[Domain] = []
    for group in ordered:
        name = domain_name(group[0].fabric, first[id(group)], (o.name for o in out))
        out.append(Domain(name, tuple(d.id for d in group)))
    return out


def reaching(device: FabricDevice, reports: Mapping[str, NodeFabric]) -> set[str]:
    """The nodes that reach ``device``: an adapter of theirs that reaches it is
    in their report."""
    return {
        a.node
        for a in device.adapters
        if a.node in reports and a.adapter in reports[a.node].adapters
    }


def labelled(nodes: Iterable[Mapping[str, Any]], domain: Domain) -> set[str]:
    """The Nodes that carry ``domain``'s label (any value)."""
    out = set()
    for node in nodes:
        meta = node.get("metadata") or {}
        if domain.label in (meta.get("labels") or {}):
            out.add(str(meta.get("name") or ""))
    return out - {""}


def findings(domain: Domain, reach: Mapping[str, set[str]], marked: set[str]) -> list[LabelFinding]:
    """Label against reach for one domain (``reach``: device id -> the nodes
    that reach it; ``marked``: the Nodes labelled for it)."""
    reached = set().union(*(reach.get(d, set()) for d in domain.devices))
    wrong = [LabelFinding(n, domain.name, True) for n in sorted(marked - reached)]
    return wrong + [LabelFinding(n, domain.name, False) for n in sorted(reached - marked)]


def selector(domain: Domain, cut: Iterable[str]) -> dict[str, Any]:
    """The slice-level ``nodeSelector`` of ``domain``'s devices: its label
    exists, and the Nodes ``cut`` (labelled, not reaching) excluded by name.

    By ``metadata.name`` (a field), not ``kubernetes.io/hostname``: a Node's
    hostname label may differ from its name, and ``NotIn`` on a label the
    Node lacks would let it through."""
    term: dict[str, Any] = {
        "matchExpressions": [{"key": domain.label, "operator": "Exists"}],
    }
    names = sorted(set(cut))
    if names:
        term["matchFields"] = [{"key": "metadata.name", "operator": "NotIn", "values": names}]
    return {"nodeSelector": {"nodeSelectorTerms": [term]}}
