"""The logical devices of one CXL memory device, each its own device (issue 35).

Two LDs of one multi-logical device share the serial, the only key the node
sees of either (Linux's ``memX/serial``; docs/fabric.md, "Logical devices").
The pool names each by ``<serial>:<LD id>`` in both shapes, and the claim's
status tells the node which of its own devices it prepares
(``PREPARED_AS_KEY``: its own name, from the serial). A claim allocated
under today's names (the serial alone) keeps running after the upgrade and is
detached on release. The real reconciler and workers run on the shipped
in-memory API and fabric (tests/unit/controller_world.py).
"""

from __future__ import annotations

import dataclasses

from driver.controller.reconciler import Reconciler
from driver.devices.model import PCI_BUS_ID
from driver.fabric_devices.naming import (
    PREPARED_AS_KEY,
    READY_CONDITION,
    cxl_key,
    device_name,
    variant_name,
)
from tests.unit.controller_world import running, settings
from tests.unit.cxl_ld_world import SERIAL, Lds, Memdevs, allocated, data_of, ld
from tests.unit.domain_claims import CLAIMS, condition, entry

OWN = variant_name(SERIAL, "node-a", "adapter0", "cxlmem")  # the node's name of either LD


async def test_per_node_each_ld_has_its_own_variant_and_the_node_prepares_its_own() -> None:
    w = Lds(ld(1, "0001"), ld(2, "0002"))
    names = [variant_name(f"{SERIAL}:000{i}", "node-a", "adapter0", "cxlmem") for i in (1, 2)]
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))):
        await w.changed.until("both LDs published", lambda: set(names) <= set(w.devices()))
        assert OWN not in w.devices()
        w.api.add(CLAIMS, allocated("fabric", names[1]))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        assert entry(w)["data"]["fabricDevice"] == "ld-2"
        assert entry(w)["data"][PREPARED_AS_KEY] == OWN
        await w.api.delete(f"{CLAIMS}/claim")
        await w.changed.until("the detach", lambda: w.fabric.devices["ld-2"].connection is None)
    assert w.asked == [("ld-2", "node-a", "adapter0")]


async def test_per_domain_each_ld_is_published_once_under_its_own_name() -> None:
    w = Lds(ld(1, "0001"), ld(2, "0002"))
    names = [device_name(f"{SERIAL}:000{i}", "cxlmem") for i in (1, 2)]
    labelled = {"metadata": {"labels": {"reach.fabric.patchbay.dev/pcie0.sw0": ""}}}
    await w.api.merge_patch("/api/v1/nodes/node-a", labelled)
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-domain"))):
        await w.changed.until("both LDs published", lambda: set(names) <= set(w.devices()))
        w.api.add(CLAIMS, allocated("fabric/pcie0.sw0", names[1]))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        assert entry(w)["data"]["fabricDevice"] == "ld-2"
        assert entry(w)["data"][PREPARED_AS_KEY] == OWN
    assert w.asked == [("ld-2", "node-a", "adapter0")]


async def test_a_claim_allocated_under_todays_name_runs_on_and_is_detached_on_release() -> None:
    """Before: the client read no LD id and the pool named LD 2 by the serial
    alone. After the upgrade the claim holding that name is attached through
    its variant's adapter, the node prepares that name as it always did (no
    ``PREPARED_AS_KEY``), and the release detaches the device."""
    before = Lds(ld(2, ""))
    async with running(
        Reconciler(before.api, before.fabric, settings(fabric_pool_shape="per-node"))
    ):
        await before.changed.until("today's name", lambda: OWN in before.devices())
    w = Lds(ld(1, "0001"), ld(2, "0002"))
    w.api = before.api  # the cluster as the old controller left it
    w.api.on_store = lambda _path, _obj: w.changed.changed()
    w.api.add(CLAIMS, allocated("fabric", OWN))
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))):
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        assert entry(w)["data"]["fabricDevice"] == "ld-2"
        assert PREPARED_AS_KEY not in entry(w)["data"]
        assert OWN in w.devices()  # still published for the claim
        await w.api.delete(f"{CLAIMS}/claim")
        await w.changed.until("the detach", lambda: w.fabric.devices["ld-2"].connection is None)
        await w.changed.until("today's name withdrawn", lambda: OWN not in w.devices())
    assert w.asked == [("ld-2", "node-a", "adapter0")]


def test_ld_zero_keeps_the_bare_serial() -> None:
    """A single-logical device (no LD id) and LD 0 are named as before."""
    assert dataclasses.replace(ld(0, "0000"), id="x").unique_identity == SERIAL
    assert ld(0, "").unique_identity == SERIAL
    assert ld(3, "0003").unique_identity == f"{SERIAL}:0003"


async def test_two_lds_on_one_node_each_prepared_as_the_memdev_that_arrived() -> None:
    """Two LDs of one MLD attached to one node through one adapter: the node
    names them by memdev; each claim's status names the memdev its own LD
    brought (asked one at a time, the new one after each), by which the node
    prepares it. Before the keys, both claims named the same node device."""
    w = Memdevs(ld(1, "0001"), ld(2, "0002"))
    names = [variant_name(f"{SERIAL}:000{i}", "node-a", "adapter0", "cxlmem") for i in (1, 2)]
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))):
        await w.changed.until("both LDs published", lambda: set(names) <= set(w.devices()))
        w.api.add(CLAIMS, allocated("fabric", names[0], 1))
        w.api.add(CLAIMS, allocated("fabric", names[1], 2))
        await w.changed.until(
            "both claims ready", lambda: all(data_of(w, c) for c in ("claim", "claim-2"))
        )
        for claim_name, device in (("claim", "ld-1"), ("claim-2", "ld-2")):
            data, bdf = data_of(w, claim_name), w.bdfs[device]
            assert data["fabricDevice"] == device and data[PCI_BUS_ID] == bdf
            key = cxl_key(SERIAL, bdf)
            assert data[PREPARED_AS_KEY] == variant_name(key, "node-a", "adapter0", "cxlmem")
        assert w.bdfs["ld-1"] != w.bdfs["ld-2"]
    assert sorted(w.asked) == [("ld-1", "node-a", "adapter0"), ("ld-2", "node-a", "adapter0")]


async def test_one_ld_released_is_detached_while_the_other_stays_prepared() -> None:
    """The node reports prepared memory by memdev (and by the serial, for
    controllers from before): the released LD's memdev is not busy, the busy
    one is the other claim's (its ``pciBusID``), so the released LD leaves at
    once. Before, the shared serial kept it until the other claim was gone."""
    w = Memdevs(ld(1, "0001"), ld(2, "0002"))
    names = [variant_name(f"{SERIAL}:000{i}", "node-a", "adapter0", "cxlmem") for i in (1, 2)]
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))):
        await w.changed.until("both LDs published", lambda: set(names) <= set(w.devices()))
        w.api.add(CLAIMS, allocated("fabric", names[0], 1))
        w.api.add(CLAIMS, allocated("fabric", names[1], 2))
        await w.changed.until(
            "both claims ready", lambda: all(data_of(w, c) for c in ("claim", "claim-2"))
        )
        w.prepared = {"ld-1", "ld-2"}
        await w.report()
        await w.api.delete(f"{CLAIMS}/claim")  # the kubelet unprepared it first
        w.prepared = {"ld-2"}
        await w.report()
        await w.changed.until("ld-1 detached", lambda: w.fabric.devices["ld-1"].connection is None)
        assert w.fabric.devices["ld-2"].connection is not None
