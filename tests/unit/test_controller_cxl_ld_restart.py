"""A restarted controller knows each prepared CXL LD as its memdev (issue 35).

The LDs of one MLD share the serial; on a node only the memdev
(``<serial>@<BDF>``) tells two apart, and a controller notes which memdev
each LD arrived as when it attaches it (``driver.controller.attach.memdevs``).
A restarted controller noted nothing: it reads the ready claims' status
(``fabricDevice``, ``pciBusID``) into its notes, so the attach of a sibling
LD that a previous incarnation asked for (no request now: adopted) takes the
one memdev no claim names, instead of failing on two memdevs it cannot tell
apart. The real reconciler and workers on the shipped in-memory API and fabric.
"""

from __future__ import annotations

from driver.controller.reconciler import Reconciler
from driver.devices.model import PCI_BUS_ID
from driver.fabric_devices.naming import FAILED_CONDITION, PREPARED_AS_KEY, cxl_key, variant_name
from tests.unit.controller_world import running, settings
from tests.unit.cxl_ld_world import SERIAL, Memdevs, allocated, data_of, ld
from tests.unit.domain_claims import CLAIMS


def failed(w: Memdevs, name: str) -> list[str]:
    """The messages of claim ``name``'s failure conditions."""
    stored = {c["metadata"]["name"]: c for c in w.api.objects(CLAIMS)}
    entries = stored[name].get("status", {}).get("devices") or ()
    return [
        c["message"]
        for e in entries
        for c in e.get("conditions", ())
        if c["type"] == FAILED_CONDITION and c["status"] == "True"
    ]


async def test_a_sibling_lds_adopted_attach_after_a_restart_takes_the_memdev_no_claim_names() -> (
    None
):
    w = Memdevs(ld(1, "0001"), ld(2, "0002"))
    names = [variant_name(f"{SERIAL}:000{i}", "node-a", "adapter0", "cxlmem") for i in (1, 2)]
    rules = settings(fabric_pool_shape="per-node")
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until("both LDs published", lambda: set(names) <= set(w.devices()))
        w.api.add(CLAIMS, allocated("fabric", names[0], 1))
        await w.changed.until("claim-1 ready", lambda: bool(data_of(w, "claim")))
    assert data_of(w, "claim")[PCI_BUS_ID] == w.bdfs["ld-1"]
    # The previous incarnation asked for claim-2's LD and stopped before its answer.
    await w.fabric.attach("ld-2", "node-a", "adapter0")
    w.prepared = {"ld-1"}
    await w.report()  # node-a shows both memdevs of the serial behind adapter0
    w.api.add(CLAIMS, allocated("fabric", names[1], 2))
    async with running(Reconciler(w.api, w.fabric, rules)):
        await w.changed.until(
            "claim-2 ready or failed", lambda: bool(data_of(w, "claim-2") or failed(w, "claim-2"))
        )
        assert failed(w, "claim-2") == []
        data = data_of(w, "claim-2")
        assert data["fabricDevice"] == "ld-2" and data[PCI_BUS_ID] == w.bdfs["ld-2"]
        own = variant_name(cxl_key(SERIAL, w.bdfs["ld-2"]), "node-a", "adapter0", "cxlmem")
        assert data[PREPARED_AS_KEY] == own
    assert w.bdfs["ld-1"] != w.bdfs["ld-2"]
    assert w.asked == [("ld-1", "node-a", "adapter0"), ("ld-2", "node-a", "adapter0")]
    assert w.fabric.detached == []  # claim-1's LD left alone
