"""Fuzzed claim inputs: opaque configs, allocation results, whole claims
through the preparer, and uevent feed lines. The property: a typed error of
driver/errors.py (or a clean result), never another exception escaping, and
a failed prepare leaves no checkpoint record, no CDI spec and no device set up."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import driver.vf.config  # noqa: F401  (registers VfConfig with the opaque decoder)
from driver.claims.allocation import Allocation, parse_allocation
from driver.config import opaque
from driver.errors import ClaimError, ConfigError
from driver.pci.uevents import UeventFeed
from tests.claims_doubles import NODE
from tests.fuzzing import FUZZ, json_values, mutated
from tests.unit.fuzz_seeds import CLAIM, CONFIG_BODY, UID, prepare_claim

CONFIGS = st.one_of(
    mutated(CONFIG_BODY),
    mutated({"apiVersion": opaque.API_VERSION, "kind": "VfConfig", "mode": "vfio-pci"}),
    json_values(),
)


@FUZZ
@given(CONFIGS)
def test_opaque_decode_fails_only_with_a_config_error(parameters: Any) -> None:
    try:
        config = opaque.decode(parameters, "config[0]")
    except ConfigError as exc:
        assert str(exc).startswith("config[0]: ")
    else:
        assert config.api_version == opaque.API_VERSION and config.kind in opaque.KINDS


@FUZZ
@given(mutated(CLAIM) | st.dictionaries(st.text(max_size=8), json_values(), max_size=3))
def test_parse_allocation_fails_only_with_a_claim_error(claim: dict[str, Any]) -> None:
    try:
        allocation = parse_allocation(claim, UID, {NODE})
    except ClaimError:
        return
    assert isinstance(allocation, Allocation)
    for device in allocation.devices:
        assert all(isinstance(v, str) for v in (device.request, device.pool, device.device))
        assert device.pool == NODE
    for config in allocation.configs:
        assert all(isinstance(r, str) for r in config.requests)
        assert isinstance(config.source, str)
        config.applies_to("gpu")


@settings(FUZZ, max_examples=50)  # a whole prepare per example
@given(mutated(CLAIM), st.lists(CONFIGS, min_size=1, max_size=2))
def test_a_fuzzed_claim_fails_cleanly_or_prepares(claim: dict[str, Any], params: list[Any]) -> None:
    devices = claim.get("status", {})
    entries = [
        {"source": "FromClaim", "opaque": {"driver": "patchbay.dev", "parameters": p}}
        for p in params
    ]
    if isinstance(devices, dict) and isinstance(devices.get("allocation"), dict):
        section = devices["allocation"].get("devices")
        if isinstance(section, dict):
            section["config"] = entries
    error, records, specs, active = prepare_claim(claim)
    assert not error.startswith("internal error"), error
    if error:
        assert records == {} and specs == [] and active == set(), error
    else:
        assert set(records) == {UID} and len(specs) == 1


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=20),
            json_values().map(lambda v: json.dumps(v).encode()),
            st.dictionaries(st.text(max_size=6), json_values(2), max_size=3).map(
                lambda d: json.dumps(d).encode()
            ),
        ),
        max_size=6,
    )
)
def test_uevent_feed_skips_malformed_lines(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "uevents.jsonl"
        path.write_bytes(b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines))
        events = UeventFeed(path, "/sys").read_new()
    assert len(events) <= len(lines)
    for event in events:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in event.properties.items())
        assert isinstance(event.action, str) and event.sys_path.startswith("/sys")
        assert isinstance(event.sequence_number, int)
