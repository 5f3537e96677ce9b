"""The validation limits the apiserver enforces on ResourceSlices.

We check devices against them before publishing, because one bad device
makes the apiserver reject its whole slice. A device that breaks a limit is
left out with a specific message; the rest of the pool is still published.
Numbers follow ``../shared/ARCHITECTURE.md`` section 5 (Kubernetes 1.35+).
"""

from __future__ import annotations

import re

from driver.devices import quantity
from driver.devices.model import AttributeValue, Device, Version

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ID_LEN = 32
MAX_DOMAIN_LEN = 63
MAX_VALUE_LEN = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS = 2
MAX_BINDING_CONDITIONS = 4

_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and bool(_DNS_LABEL.match(name))


def attribute_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid attribute/capacity name, or None."""
    domain, _, ident = name.rpartition("/")
    if not _C_IDENTIFIER.match(ident):
        return f"attribute name {name!r}: {ident!r} is not a C identifier"
    if len(ident) > MAX_ID_LEN:
        return f"attribute name {name!r}: identifier longer than {MAX_ID_LEN} characters"
    if domain and (len(domain) > MAX_DOMAIN_LEN or not _DNS_SUBDOMAIN.match(domain)):
        return f"attribute name {name!r}: invalid domain {domain!r}"
    return None


def value_problem(name: str, value: AttributeValue) -> str | None:
    if isinstance(value, Version):
        if len(value.value) > MAX_VALUE_LEN or not _SEMVER.match(value.value):
            return f"attribute {name!r}: {value.value!r} is not a semantic version"
    elif isinstance(value, str) and len(value) > MAX_VALUE_LEN:
        return f"attribute {name!r}: string longer than {MAX_VALUE_LEN} characters"
    return None


def device_problems(device: Device) -> list[str]:
    """Every limit ``device`` breaks; empty when it can be published."""
    problems: list[str] = []
    if not is_dns_label(device.name):
        problems.append(f"device name {device.name!r} is not a DNS label")
    names = set(device.attributes) | {"type"}
    if len(names) + len(device.capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"{len(names) + len(device.capacity)} attributes and capacities "
            f"(limit {MAX_ATTRIBUTES_AND_CAPACITIES})"
        )
    for name, value in device.attributes.items():
        problems.extend(p for p in (attribute_name_problem(name), value_problem(name, value)) if p)
    for name, value in device.capacity.items():
        problem = attribute_name_problem(name)
        if problem:
            problems.append(problem.replace("attribute name", "capacity name"))
        problem = quantity.problem(value)
        if problem:
            problems.append(f"capacity {name!r}: {problem}")
    for consumption in device.consumes_counters:
        for name, value in consumption.counters:
            problem = quantity.problem(value)
            if problem:
                problems.append(f"counter {consumption.counter_set}/{name}: {problem}")
    if len(device.consumes_counters) > MAX_CONSUMPTIONS:
        problems.append(f"{len(device.consumes_counters)} counter consumptions (limit 2)")
    for field_name in ("binding_conditions", "binding_failure_conditions"):
        if len(getattr(device, field_name)) > MAX_BINDING_CONDITIONS:
            problems.append(f"more than {MAX_BINDING_CONDITIONS} {field_name}")
    if bool(device.binding_conditions) != bool(device.binding_failure_conditions):
        problems.append("binding_conditions and binding_failure_conditions require each other")
    return problems
