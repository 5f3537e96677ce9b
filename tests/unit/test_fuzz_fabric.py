"""Fuzzed fabric API bodies through the real client (its HTTP call replaced
by the bodies): near-valid Redfish endpoints, connections and tasks with
fields dropped, retyped or added. The property: a parsed inventory or task,
or :class:`FabricUnavailable` naming the resource, never another exception;
an error status always becomes a :class:`FabricApiError`."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from driver.errors import FabricApiError, FabricUnavailable
from driver.fabricclient.model import FabricTask
from driver.fabricclient.transport import api_error
from tests.fuzzing import FUZZ, json_values, mutated
from tests.unit.redfish_bodies import (
    CONNECTION,
    FAB,
    INITIATOR,
    TARGET,
    TASK,
    TASK_URI,
    client,
    inventory,
)


def test_the_templates_parse() -> None:  # the fuzz starts from valid bodies
    inv = inventory([INITIATOR, TARGET], [CONNECTION])
    (device,) = inv.devices
    assert device.vendor_id == 0x10DE and device.connection is not None
    assert device.adapters[0].node == "node-a" and device.uuid.startswith("GPU-1b2c")
    task = asyncio.run(client({TASK_URI: TASK}).task(TASK_URI))
    assert task.state == "Completed" and task.device == "gpu-0"


@FUZZ
@given(
    st.lists(st.one_of(mutated(INITIATOR), mutated(TARGET), json_values(3)), max_size=3),
    st.lists(st.one_of(mutated(CONNECTION), json_values(3)), max_size=2),
)
def test_inventory_bodies_parse_or_fail_as_unavailable(
    endpoints: list[Any], connections: list[Any]
) -> None:
    try:
        inv = inventory(endpoints, connections)
    except FabricUnavailable as exc:
        assert FAB in str(exc), exc
        return
    for device in inv.devices:
        assert isinstance(device.vendor_id, int) and isinstance(device.id, str)


@FUZZ
@given(mutated(TASK))
def test_task_bodies_parse_or_fail_as_unavailable(body: dict[str, Any]) -> None:
    try:
        task = asyncio.run(client({TASK_URI: body}).task(TASK_URI))
    except FabricUnavailable as exc:
        assert TASK_URI in str(exc), exc
        return
    assert isinstance(task, FabricTask) and all(isinstance(m, str) for m in task.messages)


@FUZZ
@given(st.integers(min_value=400, max_value=599), json_values())
def test_any_error_body_is_a_fabric_api_error(status: int, body: Any) -> None:
    error = api_error(status, body)
    assert isinstance(error, FabricApiError) and error.status == status
    assert isinstance(error.code, str) and isinstance(error.message, str)
