"""Opaque config decoding and precedence (class first, claim later, later wins)."""

from __future__ import annotations

import pytest

from driver.claims.allocation import Allocation, OpaqueConfig
from driver.config import opaque
from driver.errors import ConfigError


def cfg(caps: list[str]) -> dict[str, object]:
    return {"apiVersion": opaque.API_VERSION, "kind": "GpuConfig", "driverCapabilities": caps}


def test_precedence_class_then_claim_in_order() -> None:
    alloc = Allocation(
        devices=(),
        configs=(
            OpaqueConfig("FromClaim", ("gpu",), cfg(["claim-1"]), 0),
            OpaqueConfig("FromClass", (), cfg(["class"]), 1),
            OpaqueConfig("FromClaim", (), cfg(["claim-2"]), 2),
            OpaqueConfig("FromClaim", ("other",), cfg(["other"]), 3),
        ),
    )
    chosen = alloc.configs_for("gpu/sub")
    assert [c.index for c in chosen] == [1, 0, 2]
    decoded = [opaque.decode(c.parameters, f"config[{c.index}]") for c in chosen]
    winner = opaque.effective(decoded, "gpu", "gpu-0")
    assert isinstance(winner, opaque.GpuConfig) and winner.driver_capabilities == ["claim-2"]


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"apiVersion": "v9", "kind": "GpuConfig"}, "apiVersion must be"),
        ({"apiVersion": opaque.API_VERSION, "kind": "Nope"}, "unknown kind 'Nope'"),
        ({"apiVersion": opaque.API_VERSION, "kind": "GpuConfig", "extra": 1}, "field extra"),
        (
            {"apiVersion": opaque.API_VERSION, "kind": "GpuConfig", "driverCapabilities": 3},
            "field driverCapabilities",
        ),
    ],
)
def test_decode_errors_name_the_field(params: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        opaque.decode(params, "config[4]")
    assert "config[4]" in str(info.value)
