"""Pairings when each fabric device is published once (issue 34, step 2).

A fabric device in a domain pool has no ``pcieRoot`` until attached, so a
node's adapters are published per node (``fabric/adapters/<node>``, with
root, adapter and domain) and a pairing claim asks for one; the controller
attaches the claim's fabric devices through it, and the node prepares
nothing for it. Pure functions, then the real reconciler on the shipped
in-memory API and fabric (tests/unit/controller_world.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from driver.claims.allocation import parse_allocation
from driver.controller import claims as cl
from driver.controller.pool.adapter_pools import adapter_device
from driver.controller.pool.domain_pool import (
    DomainPool,
    build_domain_pools,
    domain_device,
    unplaced,
)
from driver.controller.reconciler import Reconciler
from driver.devices.inventory import NodeInventory
from driver.devices.model import PCIE_ROOT
from driver.fabric_devices.naming import (
    ADAPTER_TYPE,
    FAILED_CONDITION,
    NodeFabric,
    adapter_device_name,
    device_name,
)
from driver.fabricclient.model import FabricInventory, HostAdapter
from driver.slices.build import build_slices
from tests.unit.controller_world import running, settings
from tests.unit.domain_claims import CLAIMS, Counting, claim, condition, entry
from tests.unit.fabric_objects import reachable_gpu

TWO = NodeFabric({"adapter0": "pci0000:15", "adapter1": "pci0000:85"})


def two_switches() -> FabricInventory:
    """gpu-a on sw0 behind node-a's adapter0 and node-b's adapter0; gpu-b on
    sw1 behind node-a's adapter1 only."""
    a = reachable_gpu("gpu-a", ("node-a", "node-b"))
    b = dataclasses.replace(
        reachable_gpu("gpu-b", ()), switch="sw1",
        adapters=(HostAdapter("node-a-a1", "pcie0", "sw1", "node-a", "adapter1"),),
    )  # fmt: skip
    return FabricInventory((a, b), ())


def test_each_nodes_adapters_are_published_on_it_with_root_and_domain() -> None:
    reports = {"node-a": TWO, "node-b": TWO, "node-c": NodeFabric({"adapter0": "pci0000:15"})}
    built = build_domain_pools("fabric", two_switches(), reports, [], (), {}, {})
    pools = {p.pool_name: p for p in built.adapters}
    # node-c's adapter reaches nothing; node-b's adapter1 is cabled to no switch.
    assert list(pools) == ["fabric/adapters/node-a", "fabric/adapters/node-b"]
    a = pools["fabric/adapters/node-a"]
    assert a.node_selection == {"nodeName": "node-a"}
    got = {d.name: (d.kind, d.attributes) for d in a.devices}
    assert got == {
        "adapter-adapter0": (ADAPTER_TYPE, {"fabricAdapter": "adapter0",
                             "fabricDomain": "pcie0.sw0", PCIE_ROOT: "pci0000:15"}),
        "adapter-adapter1": (ADAPTER_TYPE, {"fabricAdapter": "adapter1",
                             "fabricDomain": "pcie0.sw1", PCIE_ROOT: "pci0000:85"}),
    }  # fmt: skip
    assert [d.name for d in pools["fabric/adapters/node-b"].devices] == ["adapter-adapter0"]
    # Every pairing claim on the node goes through it: many allocations, no capacity.
    (stored,) = build_slices(a)
    assert all(d["allowMultipleAllocations"] is True for d in stored.spec["devices"])
    assert all("capacity" not in d for d in stored.spec["devices"])
    assert stored.spec["nodeName"] == "node-a"
    assert adapter_device_name("Adapter_0").startswith("adapter-")  # hashed: "_" is no DNS
    assert len(adapter_device_name("Adapter_0")) == len(adapter_device_name("A" * 70)) == 24


def allocation(device: str, *adapters: str) -> cl.FabricAllocation:
    pool = "fabric/adapters/node-a"
    return cl.FabricAllocation(
        "uid-1", "default", "claim", device, False, False, node="node-a",
        adapters=tuple((pool, adapter_device_name(x)) for x in adapters),
    )  # fmt: skip


def test_the_claims_adapter_is_the_one_attached_through() -> None:
    b = reachable_gpu("gpu-b", ("node-a",))  # behind both of node-a's adapters
    b = dataclasses.replace(b, adapters=(*b.adapters, HostAdapter(
        "node-a-a1", "pcie0", "sw0", "node-a", "adapter1")))  # fmt: skip
    inv = FabricInventory((reachable_gpu("gpu-a", ("node-a",)), b), ())
    reports = {"node-a": TWO}
    model = DomainPool()
    model.build("fabric", inv, reports, (), {}, {}, {}, [])
    v = unplaced(device_name("GPU-gpu-b"), "gpu-b", "gpu", "GPU-gpu-b")
    # Without an adapter: the first that reaches it; with one: that one.
    assert model.place(v, allocation(v.name), inv, reports).adapter == "adapter0"
    got = model.place(v, allocation(v.name, "adapter1"), inv, reports)
    assert (got.adapter, got.root, got.why) == ("adapter1", "pci0000:85", "")
    # A claimed adapter that does not reach the device: no adapter, and why.
    a = unplaced(device_name("GPU-gpu-a"), "gpu-a", "gpu", "GPU-gpu-a")
    refused = model.place(a, allocation(a.name, "adapter1"), inv, reports)
    assert refused.adapter == "" and "adapter1" in refused.why and "gpu-a" in refused.why


def paired(node: str, adapter: str) -> dict[str, Any]:
    c = claim(node)
    pool = f"fabric/adapters/{node}"
    result = {"request": "adapter", "driver": "patchbay.dev", "pool": pool}
    c["status"]["allocation"]["devices"]["results"].append(
        result | {"device": adapter_device_name(adapter)}
    )
    return c


async def test_a_claims_adapter_that_does_not_reach_fails_the_binding_naming_it() -> None:
    w = Counting()
    w.api.add(CLAIMS, paired("node-a", "adapter9"))  # node-a reports no such adapter
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))):
        await w.changed.until("the failure", lambda: condition(w, FAILED_CONDITION))
    message = next(c["message"] for c in entry(w)["conditions"] if c["type"] == FAILED_CONDITION)
    assert "adapter-adapter9" in message and "gpu-0" in message and w.asked == []


async def test_a_paired_claim_is_attached_through_its_adapter_and_only_its_device() -> None:
    w = Counting()
    w.api.add(CLAIMS, paired("node-a", "adapter0"))
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))):
        await w.changed.until("the claim ready", lambda: condition(w, "FabricDeviceReady"))
    assert w.asked == [("gpu-0", "node-a", "adapter0")]  # the adapter itself: nothing asked
    assert entry(w)["device"] == device_name("GPU-0")


def test_the_node_prepares_nothing_for_the_claims_adapter() -> None:
    inventory = NodeInventory()
    inventory.replace_pool("fabric", [])
    inventory.replace_pool("node-a", [])
    c = paired("node-a", "adapter0")
    devices = parse_allocation(c, "uid-1", inventory.pools()).devices
    assert [d.request for d in devices] == ["gpu"]


EXAMPLES = Path(__file__).parents[2] / "deviceclasses/examples"
PAIRINGS = ("fabric-gpu-vf-pair.yaml", "gpu-nvme-gds.yaml", "gpu-cxl-memory.yaml")


def test_the_per_domain_examples_pair_on_what_the_pools_publish() -> None:
    """Each pairing example's constraints name attributes that the devices its
    requests can get carry, with equal values when they sit together: a
    domain pool's GPU, NVMe drive and CXL memory, the node's adapter (and a
    local VF's root, the adapter's)."""
    gpu = reachable_gpu("gpu-0", ("node-a",))
    kinds = {
        "gpu.patchbay.dev": gpu,
        "nvme.patchbay.dev": dataclasses.replace(
            gpu, id="nvme-0", kind="nvme", uuid="", capacity_bytes=2 << 40
        ),
        "cxl-memory.patchbay.dev": dataclasses.replace(
            gpu, id="cxl-0", kind="cxlmem", uuid="", capacity_bytes=2 << 40
        ),
    }
    published = {c: domain_device(d, "pcie0.sw0").to_json()["attributes"] for c, d in kinds.items()}
    published["fabric-adapter.patchbay.dev"] = adapter_device(
        "adapter0", "pci0000:15", "pcie0.sw0"
    ).to_json()["attributes"]
    published["vf.patchbay.dev"] = {PCIE_ROOT: {"string": "pci0000:15"}}  # a local VF's root
    seen = 0
    for path in (EXAMPLES / name for name in PAIRINGS):
        (tmpl,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] ==
                   "ResourceClaimTemplate"]  # fmt: skip
        devices = tmpl["spec"]["spec"]["devices"]
        classes = {r["name"]: r["exactly"]["deviceClassName"] for r in devices["requests"]}
        assert "fabric-adapter.patchbay.dev" in classes.values(), path.name
        for c in devices["constraints"]:
            key = c["matchAttribute"].removeprefix("patchbay.dev/")
            values = [published[classes[r]].get(key) for r in c["requests"]]
            assert values[0] is not None and all(v == values[0] for v in values), (path.name, c)
            seen += 1
    assert seen == 4  # rdma-job's two, GDS's and CXL memory's one each
