"""Quantities in the apiserver's canonical form, and a published pool that the
apiserver's canonical copy does not make us rewrite (it did on A100 nodes:
``81920Mi`` published, ``80Gi`` stored, a difference no write removes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint import Checkpoint
from driver.devices import quantity
from driver.devices.model import CounterConsumption, CounterSet, Device
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices.build import PoolSpec, build_slices, slice_object
from driver.slices.diff import diff_pool

OWNER = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"}


@pytest.mark.parametrize(
    ("published", "stored"),
    [
        ("81920Mi", "80Gi"),  # A100-80GB
        ("40960Mi", "40Gi"),  # A100-40GB
        ("16384Mi", "16Gi"),  # H200 1g.18gb (a real H200, driver 580.159.04)
        ("33280Mi", "33280Mi"),  # H200 1g.35gb: 32.5 GiB, not whole: stays
        ("71424Mi", "71424Mi"),  # H200 3g.71gb
        ("143360Mi", "140Gi"),  # H200 7g.141gb
        ("9856Mi", "9856Mi"),  # not whole GiB: stays
        ("4864Mi", "4864Mi"),
        ("80384Mi", "80384Mi"),
        ("81559Mi", "81559Mi"),  # H100
        ("1024Mi", "1Gi"),
        ("2048Ki", "2Mi"),
        ("1536", "1536"),  # decimal stays decimal
        ("1.5Gi", "1536Mi"),
        ("0.5Ki", "512"),  # below 1024: decimal
        ("0", "0"),
        ("7", "7"),
        ("132", "132"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("12000", "12k"),
        ("1.5", "1500m"),
        ("1000m", "1"),
        ("-1024Mi", "-1Gi"),
    ],
)
def test_canonical_form(published: str, stored: str) -> None:
    assert quantity.canonical(published) == stored
    assert quantity.canonical(stored) == stored


def test_forms_we_never_write_are_refused() -> None:
    for bad in ("1e3", "12 Mi", "Mi", "1.5.1", ""):
        assert quantity.problem(bad) is not None
        with pytest.raises(ValueError):
            quantity.canonical(bad)


def test_device_with_an_unusable_quantity_is_left_out() -> None:
    bad = Device("gpu-1", "gpu", "y", capacity={"memory": "1e3"})
    slices = build_slices(pool([Device("gpu-0", "gpu", "x"), bad]))
    assert [d["name"] for d in slices[0].spec["devices"]] == ["gpu-0"]


def test_capacities_and_counters_are_published_canonical() -> None:
    use = CounterConsumption("gpu-0-mig", (("mem0", "1"), ("memory", "16384Mi")))
    d = Device("gpu-0", "gpu", "x", capacity={"memory": "81920Mi"}, consumes_counters=(use,))
    body = d.to_json()
    assert body["capacity"] == {"memory": {"value": "80Gi"}}
    assert body["consumesCounters"][0]["counters"]["memory"] == {"value": "16Gi"}
    cset = CounterSet("gpu-0-mig", (("memory", "143360Mi"),))
    assert cset.to_json()["counters"] == {"memory": {"value": "140Gi"}}


def pool(devices: list[Device], sets: tuple[CounterSet, ...] = ()) -> PoolSpec:
    return PoolSpec(
        "patchbay.dev", "n1", "n1-patchbay", {"nodeName": "n1"}, tuple(devices), sets, OWNER
    )


def _apiserver_copy(value: Any) -> Any:
    """What the apiserver returns for what we wrote: quantities (every
    ``{"value": ...}``) canonical. Our own small oracle for the forms the GPU
    pools hold (``<n>Mi``, ``<n>Gi`` and small integers), independent of the
    driver's."""
    if isinstance(value, dict):
        if set(value) == {"value"} and isinstance(value["value"], str):
            text = value["value"]
            if m := re.fullmatch(r"([0-9]+)Mi", text):
                mib = int(m[1])
                return {"value": f"{mib // 1024}Gi" if mib % 1024 == 0 else text}
            assert re.fullmatch(r"[0-9]{1,3}|[0-9]+Gi", text), text
            return {"value": text}
        return {k: _apiserver_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_apiserver_copy(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("model", "mig"),
    [("A100-SXM4-40GB", False), ("A100-SXM4-80GB", False), ("A100-SXM4-80GB", True),
     ("H200-SXM5-141GB", True)],
)  # fmt: skip
def test_pool_at_rest_after_the_apiserver_canonicalised_it(model: str, mig: bool) -> None:
    machine = FakeMachine()
    for i in range(2):
        machine.add_gpu(f"GPU-{i:04d}", model, f"0000:{0x10 + i:02x}:00.0", mig=mig)
    backend = FakeNvml(machine)
    policy = MigPolicy.parse("all" if mig else "", "", True, False)
    support = MigSupport(
        NvmlSession(backend),
        policy,
        lambda s, g: MigHandler(s, g, Path("/nonexistent")),
        Checkpoint,
    )
    found = GpuType(backend, Path("/nonexistent"), Path("/nonexistent"), mig=support).discover()
    assert found.devices
    p = pool(list(found.devices), found.counter_sets)
    desired = build_slices(p)
    stored = {
        d.name: _apiserver_copy(slice_object(p, d, 1, len(desired)))
        for d in desired
    }  # fmt: skip
    diff = diff_pool(desired, stored, OWNER)
    assert diff.in_sync, (
        f"{model}: the stored pool would be rewritten at generation {diff.generation}"
    )
