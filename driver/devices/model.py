"""Devices as patchbay publishes them in ResourceSlices.

Discovery (NVML, sysfs) produces :class:`Device` values; the slice builder
turns them into API objects. The model is frozen and hashable so two
discoveries can be compared cheaply, and it knows the JSON shape the
``resource.k8s.io/v1`` API expects for its attribute and capacity values.
Capacities and counters are serialised in canonical quantity form
(:mod:`driver.devices.quantity`), as the apiserver stores them, so a stored
slice compares equal to the one we would write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver import DRIVER_NAME
from driver.devices.quantity import canonical

# Standard attribute names (their own domain, not ours).
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"

# Our own attribute names are published unqualified: the apiserver and CEL
# treat them as ``patchbay.dev/<name>`` because the slice's driver is ours.
TYPE = "type"
ATTACHMENT = "attachment"


@dataclass(frozen=True)
class Version:
    """A semantic-version attribute value (published as ``version``)."""

    value: str


AttributeValue = bool | int | str | Version


def qualified(name: str) -> str:
    """The fully qualified attribute name, as ``matchAttribute`` spells it."""
    return name if "/" in name else f"{DRIVER_NAME}/{name}"


def attribute_json(value: AttributeValue) -> dict[str, Any]:
    """One attribute value in the API's tagged-union shape."""
    # bool first: bool is a subclass of int.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def attribute_value(raw: Mapping[str, Any]) -> AttributeValue:
    """The inverse of :func:`attribute_json` (an unknown shape reads as "")."""
    if "bool" in raw:
        return bool(raw["bool"])
    if "int" in raw:
        return int(raw["int"])
    if "version" in raw:
        return Version(str(raw["version"]))
    return str(raw.get("string", ""))


@dataclass(frozen=True)
class CounterConsumption:
    """How much of which counters in a counter set a device uses."""

    counter_set: str
    counters: tuple[tuple[str, str], ...]  # (counter name, quantity)
    # Device compatibility groups (KEP-5963, alpha ``DRADeviceCompatibilityGroups``):
    # devices drawing on one counter set are allocated together only when
    # their groups intersect (driver.gpu.modes); empty: the field is left out.
    compatibility_groups: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "counterSet": self.counter_set,
            "counters": {name: {"value": canonical(value)} for name, value in self.counters},
        }
        if self.compatibility_groups:
            out["compatibilityGroups"] = list(self.compatibility_groups)
        return out


@dataclass(frozen=True)
class CounterSet:
    """A pool-level set of counters shared by devices (partitionable devices)."""

    name: str
    counters: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counters": {name: {"value": canonical(value)} for name, value in self.counters},
        }


def drawn_on(sets: Iterable[CounterSet], devices: Iterable[Device]) -> tuple[CounterSet, ...]:
    """The counter sets some device of ``devices`` consumes from, in their order.

    A set nothing draws on tells the scheduler of capacity no device offers:
    a fabric GPU's MIG counters once its placements left the node's pool."""
    used = {c.counter_set for d in devices for c in d.consumes_counters}
    return tuple(s for s in sets if s.name in used)


@dataclass(frozen=True)
class RequestPolicy:
    """How claims consume a capacity of a shareable device
    (``allowMultipleAllocations``): ``default`` for a request that does not
    name it, and the valid range ``min`` + n * ``step`` up to ``max``."""

    default: str
    min: str
    step: str | None = None
    max: str | None = None

    def to_json(self) -> dict[str, Any]:
        valid = {"min": canonical(self.min)}
        if self.max is not None:
            valid["max"] = canonical(self.max)
        if self.step is not None:
            valid["step"] = canonical(self.step)
        return {"default": canonical(self.default), "validRange": valid}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RequestPolicy:
        valid = raw.get("validRange") or {}
        step, top = valid.get("step"), valid.get("max")
        return cls(
            default=str(raw.get("default")),
            min=str(valid.get("min")),
            step=None if step is None else str(step),
            max=None if top is None else str(top),
        )


@dataclass(frozen=True)
class DeviceTaint:
    """A taint on a device (``DRADeviceTaints``): claims that do not tolerate
    it are not allocated the device (``NoSchedule``) or are evicted
    (``NoExecute``). ``time_added`` is RFC 3339; we set it so the apiserver
    has nothing to default (a defaulted field would read as a difference)."""

    key: str
    value: str
    effect: str
    time_added: str

    def to_json(self) -> dict[str, Any]:
        out = {"key": self.key, "effect": self.effect, "timeAdded": self.time_added}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class Device:
    """One allocatable device of a pool.

    ``attributes`` keys are attribute names (unqualified for ours, qualified
    for standard ones); ``capacity`` values are Kubernetes quantities.
    ``kind`` is the device type (``gpu``, ``mig``, ``vf``) and ``local_id``
    the stable hardware identity (GPU UUID, VF BDF) the preparer uses.
    ``parent`` is the ``local_id`` of the device this one is carved from (a
    MIG placement's GPU), kept here and never published: the lean MIG
    devices name no parent (docs/scale.md), and the health monitor still
    needs it.
    """

    name: str
    kind: str
    local_id: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    consumes_counters: tuple[CounterConsumption, ...] = ()
    node_name: str | None = None
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    # Consumable capacity (``DRAConsumableCapacity``): several claims share
    # the device, each consuming part of the capacities that have a policy.
    allow_multiple_allocations: bool = False
    request_policies: tuple[tuple[str, RequestPolicy], ...] = ()
    parent: str | None = None

    def has_counters(self) -> bool:
        return bool(self.consumes_counters)

    def to_json(self) -> dict[str, Any]:
        """The device as it appears in ``ResourceSlice.spec.devices``."""
        out: dict[str, Any] = {"name": self.name}
        attrs = dict(self.attributes)
        attrs.setdefault(TYPE, self.kind)
        out["attributes"] = {k: attribute_json(attrs[k]) for k in sorted(attrs)}
        if self.capacity:
            policies = dict(self.request_policies)
            out["capacity"] = {}
            for k in sorted(self.capacity):
                entry: dict[str, Any] = {"value": canonical(self.capacity[k])}
                if k in policies:
                    entry["requestPolicy"] = policies[k].to_json()
                out["capacity"][k] = entry
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.consumes_counters:
            out["consumesCounters"] = [c.to_json() for c in self.consumes_counters]
        if self.node_name is not None:
            out["nodeName"] = self.node_name
        if self.binds_to_node:
            out["bindsToNode"] = True
        if self.binding_conditions:
            out["bindingConditions"] = list(self.binding_conditions)
        if self.binding_failure_conditions:
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        if self.taints:
            out["taints"] = [t.to_json() for t in self.taints]
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], local_id: str = "") -> Device:
        """A device read back from ``ResourceSlice.spec.devices`` (the inverse of
        :meth:`to_json`; ``kind`` comes from the ``type`` attribute)."""
        attrs = {k: attribute_value(v) for k, v in (raw.get("attributes") or {}).items()}
        kind = str(attrs.pop(TYPE, ""))
        capacity = raw.get("capacity") or {}
        return cls(
            name=str(raw["name"]),
            kind=kind,
            local_id=local_id,
            attributes=attrs,
            capacity={k: str(v.get("value")) for k, v in capacity.items()},
            consumes_counters=tuple(
                CounterConsumption(
                    str(c["counterSet"]),
                    tuple((n, str(v.get("value"))) for n, v in (c.get("counters") or {}).items()),
                )
                for c in raw.get("consumesCounters") or ()
            ),
            node_name=raw.get("nodeName"),
            binds_to_node=bool(raw.get("bindsToNode")),
            binding_conditions=tuple(raw.get("bindingConditions") or ()),
            binding_failure_conditions=tuple(raw.get("bindingFailureConditions") or ()),
            taints=tuple(
                DeviceTaint(
                    str(t["key"]),
                    str(t.get("value", "")),
                    str(t["effect"]),
                    str(t.get("timeAdded", "")),
                )
                for t in raw.get("taints") or ()
            ),
            allow_multiple_allocations=bool(raw.get("allowMultipleAllocations")),
            request_policies=tuple(
                (k, RequestPolicy.from_json(v["requestPolicy"]))
                for k, v in sorted(capacity.items())
                if v.get("requestPolicy")
            ),
        )
