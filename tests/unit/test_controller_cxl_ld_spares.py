"""CXL logical devices as warm spares and as a count manager's slots (issue 35).

The LDs of one MLD share the serial; on a node only the memdev
(``<serial>@<BDF>``) tells two apart (docs/fabric.md, "Logical devices").
A warm spare is published without binding conditions, so the node prepares
it by its published name before the controller writes anything: a spare
that is an LD must be published under its memdev's node name, found as a
claim's attach finds it (the memdevs noted before the request, the new one
after). A count manager's slot names no device: the claim's status must name
the memdev that arrived (``preparedAs``, ``pciBusID``), not the serial's
name, which the node cannot resolve once two LDs of the MLD are there. The
real reconciler and workers run on the shipped in-memory API and fabric.
"""

from __future__ import annotations

from typing import Any

import pytest

from driver.controller.pool.slots import slot_id
from driver.controller.reconciler import Reconciler
from driver.devices.model import PCI_BUS_ID
from driver.fabric_devices.naming import (
    PREPARED_AS_KEY,
    cxl_key,
    variant_name,
)
from driver.fabricclient.dialect_count import CountAttachResult, CountResource
from driver.fabricclient.model import AttachResult
from tests.unit.controller_world import running, settings
from tests.unit.cxl_ld_world import SERIAL, Memdevs, allocated, data_of, ld
from tests.unit.domain_claims import CLAIMS

LABEL = {"metadata": {"labels": {"reach.fabric.patchbay.dev/pcie0.sw0": ""}}}


def memdev_name(w: Memdevs, device: str) -> str:
    """The node's name of the memdev ``device`` is attached as."""
    return variant_name(cxl_key(SERIAL, w.bdfs[device]), "node-a", "adapter0", "cxlmem")


def spares(w: Memdevs) -> set[str]:
    """The published spares (an adapter pool's devices carry no ``spare``)."""
    return {n for n, d in w.devices().items() if d["attributes"].get("spare", {}).get("bool")}


def taken(pool: str, name: str, n: int) -> dict[str, Any]:
    """Claim ``n`` allocated the spare ``name``: no binding conditions."""
    out = allocated(pool, name, n)
    result = out["status"]["allocation"]["devices"]["results"][0]
    del result["bindingConditions"], result["bindingFailureConditions"]
    return out


@pytest.mark.parametrize("shape", ["per-node", "per-domain"])
async def test_two_lds_as_spares_on_one_node_each_published_and_taken_as_its_memdev(
    shape: str,
) -> None:
    """Two LDs of one MLD kept as spares on node-a: each is published under
    its own memdev's node name (attached one at a time, the new memdev after
    each), so the node prepares it by that name; a claim taking each gets its
    own memdev (``pciBusID``), and the first one prepared does not make the
    other spare leave (busy is by memdev). Before: both were published under
    names from ``<serial>:<LD>``, which the node knows nothing of."""
    w = Memdevs(ld(1, "0001"), ld(2, "0002"))
    await w.api.merge_patch("/api/v1/nodes/node-a", LABEL)
    rules = settings(fabric_pool_shape=shape, spares_fixed="cxlmem:CZ120=2", spares_cap=1.0)
    pool = "fabric" if shape == "per-node" else "fabric/spares/node-a"
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("both LDs attached", lambda: len(w.bdfs) == 2)
        names = {d: memdev_name(w, d) for d in ("ld-1", "ld-2")}
        await w.changed.until("both spares published", lambda: set(names.values()) <= spares(w))
        w.api.add(CLAIMS, taken(pool, names["ld-1"], 1))
        await w.changed.until("claim 1 ready", lambda: PCI_BUS_ID in data_of(w, "claim"))
        w.prepared = {"ld-1"}
        await w.report()
        w.api.add(CLAIMS, taken(pool, names["ld-2"], 2))
        await w.changed.until("claim 2 ready", lambda: PCI_BUS_ID in data_of(w, "claim-2"))
        for claim_name, device in (("claim", "ld-1"), ("claim-2", "ld-2")):
            data = data_of(w, claim_name)
            assert data["fabricDevice"] == device and data[PCI_BUS_ID] == w.bdfs[device]
            assert data.get(PREPARED_AS_KEY, names[device]) == names[device]
    assert w.fabric.detached == [] and len(w.fabric.attached) == 2


class CountLds(Memdevs):
    """A count-based manager over the MLD's LDs: a scale-up attaches the
    lowest free LD of the model asked for and names it by its serial."""

    def __init__(self) -> None:
        super().__init__(ld(1, "0001"), ld(2, "0002"))
        self.fabric.picks_devices = True
        attach = self.fabric.attach

        async def pick(device_id: str, node: str, adapter: str, key: str = "") -> AttachResult:
            free = sorted(d for d, dev in self.fabric.devices.items() if dev.connection is None)
            await attach(free[0], node, adapter, key)
            got = CountResource(f"res-{free[0]}", SERIAL, "cxlmem", "CZ120", "OK")
            return CountAttachResult(f"/machines/m#res-{free[0]}", None, got)

        self.fabric.attach = pick  # type: ignore[method-assign]


async def test_count_slots_of_two_lds_each_prepared_as_the_memdev_that_arrived() -> None:
    """Two slots of the MLD's model on node-a, allocated one after the other:
    each claim's status names the memdev its scale-up brought (the new one
    since the request), by which the node prepares the slot. Before: both
    named the serial's node name, which no memdev answers to once two LDs of
    one serial are on the node."""
    w = CountLds()
    slot = [variant_name(slot_id("sw0", "CZ120", "node-a", "adapter0", i), "node-a", "adapter0",
                         "cxlmem") for i in (0, 1)]  # fmt: skip
    async with running(Reconciler(w.api, w.fabric, settings(fabric_pool_shape="per-node"))):
        await w.changed.until("the slots published", lambda: set(slot) <= set(w.devices()))
        w.api.add(CLAIMS, allocated("fabric", slot[0], 1))
        await w.changed.until("claim 1 ready", lambda: PREPARED_AS_KEY in data_of(w, "claim"))
        w.prepared = {"ld-1"}
        await w.report()
        w.api.add(CLAIMS, allocated("fabric", slot[1], 2))
        await w.changed.until("claim 2 ready", lambda: PREPARED_AS_KEY in data_of(w, "claim-2"))
    for claim_name, device in (("claim", "ld-1"), ("claim-2", "ld-2")):
        data = data_of(w, claim_name)
        assert data["fabricDevice"] == device and data[PCI_BUS_ID] == w.bdfs[device]
        assert data[PREPARED_AS_KEY] == memdev_name(w, device)
    assert w.bdfs["ld-1"] != w.bdfs["ld-2"]


async def test_spares_whose_memdev_a_restart_cannot_tell_are_released_and_attached_again() -> None:
    """A restarted controller noted nothing: node-a shows two memdevs of the
    MLD's serial behind adapter0, and which spare is which cannot be told.
    Each is released (not published under a guess) and attached again, one
    at a time, its memdev noted; both are then published as their memdevs."""
    w = Memdevs(ld(1, "0001"), ld(2, "0002"))
    rules = settings(fabric_pool_shape="per-node", spares_fixed="cxlmem:CZ120=2", spares_cap=1.0)
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("both LDs attached", lambda: len(w.bdfs) == 2)
        names = {memdev_name(w, d) for d in ("ld-1", "ld-2")}
        await w.changed.until("both spares published", lambda: names <= spares(w))
    assert w.fabric.detached == []
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("both released", lambda: len(w.fabric.detached) == 2)
        await w.changed.until(
            "both attached again and published",
            lambda: len(w.fabric.attached) == 4 and names <= spares(w),
        )
    assert sorted(w.fabric.detached) == ["ld-1", "ld-2"]
