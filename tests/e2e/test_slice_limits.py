"""The real apiserver enforces each slice limit of ``driver/slices/limits.py``.

Why: the slice publisher keeps every device within those numbers (a device
that breaks one is left out, the rest of the pool is published), because
one device over a limit makes the apiserver refuse its whole slice. These
tests prove the numbers are the apiserver's: for each limit, a slice at the
limit is accepted and one over it refused, both as dry runs against the
local control plane (tests/harness/cluster.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from driver.slices import limits
from tests.e2e.helpers import unique

pytestmark = pytest.mark.cluster


def _slice(name: str, driver: str, spec: dict[str, Any]) -> dict[str, Any]:
    pool = {"name": name, "generation": 1, "resourceSliceCount": 1}
    return {
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": "nowhere", "pool": pool, **spec},
    }


def _refused(create: Any, body: dict[str, Any]) -> str:
    """The apiserver's 422 message for ``body`` (a dry run), or fail if it accepts it."""
    try:
        create(body, dry_run="All")
    except ApiException as err:
        assert err.status == 422, err.body
        return str(json.loads(err.body)["message"])
    pytest.fail("the apiserver accepted a ResourceSlice over a limit")


def _taint() -> dict[str, Any]:
    return {"key": "patchbay.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


def _consumes(*sets: str) -> list[dict[str, Any]]:
    return [{"counterSet": s, "counters": {"memory": {"value": "1"}}} for s in sets]


def _devices(n: int, **fields: Any) -> dict[str, Any]:
    return {"devices": [{"name": f"dev-{i}", **fields} for i in range(n)]}


def _one_device(**fields: Any) -> dict[str, Any]:
    return {"devices": [{"name": "dev-0", **fields}]}


def _counter_sets(n: int, counters: int = 1) -> dict[str, Any]:
    return {
        "sharedCounters": [
            {"name": f"set-{i}", "counters": {f"c{j}": {"value": "1"} for j in range(counters)}}
            for i in range(n)
        ]
    }


# (limit, what the slice spec holds at n, the field the refusal names), one
# case per limit of driver/slices/limits.py the apiserver enforces on a slice.
LIMIT_CASES: dict[str, tuple[int, Callable[[int], dict[str, Any]], str]] = {
    "devices": (limits.MAX_DEVICES, _devices, "spec.devices"),
    "devices-with-counters": (
        limits.MAX_DEVICES_WITH_COUNTERS_OR_TAINTS,
        lambda n: _devices(n, consumesCounters=_consumes("set-0")),
        "spec.devices",
    ),
    "devices-with-taints": (
        limits.MAX_DEVICES_WITH_COUNTERS_OR_TAINTS,
        lambda n: _devices(n, taints=[_taint()]),
        "spec.devices",
    ),
    "counter-sets": (limits.MAX_COUNTER_SETS, _counter_sets, "spec.sharedCounters"),
    "counters-per-set": (
        limits.MAX_COUNTERS_PER_SET,
        lambda n: _counter_sets(1, counters=n),
        "spec.sharedCounters[0].counters",
    ),
    "consumptions": (
        limits.MAX_CONSUMPTIONS,
        lambda n: _one_device(consumesCounters=_consumes(*(f"set-{i}" for i in range(n)))),
        "spec.devices[0].consumesCounters",
    ),
    "binding-conditions": (
        limits.MAX_BINDING_CONDITIONS,
        lambda n: _one_device(
            bindingConditions=[f"ready-{i}" for i in range(n)],
            bindingFailureConditions=["failed"],
        ),
        "spec.devices[0].bindingConditions",
    ),
    "binding-failure-conditions": (
        limits.MAX_BINDING_CONDITIONS,
        lambda n: _one_device(
            bindingConditions=["ready"],
            bindingFailureConditions=[f"failed-{i}" for i in range(n)],
        ),
        "spec.devices[0].bindingFailureConditions",
    ),
    "attributes-and-capacities": (
        limits.MAX_ATTRIBUTES_AND_CAPACITIES,
        lambda n: _one_device(attributes={f"a{i}": {"int": i} for i in range(n)}),
        "spec.devices[0]",
    ),
    "attribute-name-length": (
        limits.MAX_ID_LEN,
        lambda n: _one_device(attributes={f"patchbay.dev/{'a' * n}": {"string": "x"}}),
        "spec.devices[0].attributes",
    ),
}


@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_apiserver_enforces_the_slice_limits_we_publish_within(
    resource_api: client.ResourceV1Api, case: str
) -> None:
    # driver/slices/limits.py holds the numbers the publisher keeps devices
    # within; the real apiserver must take each limit and refuse one more.
    limit, spec, field = LIMIT_CASES[case]
    driver, name = f"{unique('v')}.e2e.patchbay.dev", unique("limit")

    resource_api.create_resource_slice(_slice(name, driver, spec(limit)), dry_run="All")
    message = _refused(resource_api.create_resource_slice, _slice(name, driver, spec(limit + 1)))
    assert field in message, message
    assert str(limit) in message, message
    print(f"{case}: {limit} accepted, {limit + 1} refused: {message}")
