"""The node's key of fabric CXL memory: the memdev, not the serial (issue 35).

Two logical devices of one multi-logical device attached to one host through
one adapter are two memdevs with one serial (the simulated host writes them
as Linux shows them). The plugin names each by ``<serial>@<BDF>``, reports
both in the Node annotation's ``cxlmem``, and prepares each as itself. A
memdev alone with its serial also answers to the name from the serial, and
the annotation carries the bare serial for it, so claims and controllers
from before the keys go on working; an older plugin's report (bare serials)
still reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.controller.attach import memdevs
from driver.cxl.kind import CxlMemoryType
from driver.cxl.prepare import DEVICES_ENV, CxlMemoryHandler
from driver.devices.inventory import ALIAS, NodeInventory
from driver.devices.model import Device
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric, cxl_key, variant_name
from driver.fabric_devices.node import FabricNodeView
from driver.fabricclient.model import FabricDevice
from fabric.simhost import TOPOLOGIES, CxlMemory, SimHost

ADAPTERS = {"adapter0": "0000:15:02.0", "adapter1": "0000:85:02.0"}
SERIAL = "0x4c1d96fffeddd835"
OLD = variant_name(SERIAL, "node-a", "adapter0", "cxlmem")  # the name from the serial


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp_path / "node-a", "node-a")


def attach(host: SimHost, adapter: str = "adapter0", size: int = 16 << 30) -> str:
    bdf = host.free_bdf(adapter)
    host.hot_add(adapter, CxlMemory(bdf, int(SERIAL, 16), size))
    return bdf


def fabric_devices(host: SimHost) -> list[Device]:
    view = FabricNodeView("node-a", ADAPTERS, host.sysfs_root)
    found = CxlMemoryType(host.sysfs_root, host.dev_root, view.behind_adapter).discover()
    local, fabric = view.split(list(found.devices))
    assert local == []
    return fabric


def report(host: SimHost, held: set[tuple[str, str]] = set()) -> NodeFabric:  # noqa: B006
    view = FabricNodeView("node-a", ADAPTERS, host.sysfs_root)
    return view.report(fabric_devices(host), held)


def test_two_lds_of_one_mld_behind_one_adapter_are_two_devices(host: SimHost) -> None:
    first, second = attach(host), attach(host)
    keys = [cxl_key(SERIAL, first), cxl_key(SERIAL, second)]
    devices = {str(d.attributes["fabricIdentity"]): d for d in fabric_devices(host)}
    assert sorted(devices) == keys
    for key in keys:
        assert devices[key].name == variant_name(key, "node-a", "adapter0", "cxlmem")
        assert ALIAS not in devices[key].attributes  # the serial names neither
    assert [devices[k].local_id for k in keys] == [first, second]
    r = report(host)
    assert r.cxlmem == {k: "adapter0" for k in keys}
    assert r.memdevs(SERIAL, "adapter0") == keys and r.sees("cxlmem", SERIAL, "adapter0")
    assert json.loads(r.to_annotation())["cxlmem"] == {k: "adapter0" for k in keys}


def test_each_ld_is_prepared_as_itself(host: SimHost) -> None:
    attach(host), attach(host)
    inv = NodeInventory()
    inv.replace_pool("fabric", fabric_devices(host))
    handler = CxlMemoryHandler(host.sysfs_root, host.dev_root)
    paths = set()
    for device in inv.devices("fabric"):
        prepared = handler.prepare(device, "uid", None)
        ((env, path),) = prepared.claim_lists
        assert env == DEVICES_ENV
        paths.add(path)
    assert len(paths) == 2  # two dax devices, one per LD


def test_a_memdev_alone_with_its_serial_answers_to_the_old_name(host: SimHost) -> None:
    bdf = attach(host)
    inv = NodeInventory()
    inv.replace_pool("fabric", fabric_devices(host))
    found = inv.lookup("fabric", OLD)
    assert found is not None and (found.name, found.local_id) == (OLD, bdf)
    body = json.loads(report(host, {("cxlmem", bdf)}).to_annotation())
    # A controller from before the keys finds it by the serial, and busy by it.
    assert body["cxlmem"] == {cxl_key(SERIAL, bdf): "adapter0", SERIAL: "adapter0"}
    assert SERIAL in body["busy"]
    # A second LD arrives: the serial names neither any more.
    attach(host)
    inv.replace_pool("fabric", fabric_devices(host))
    assert inv.lookup("fabric", OLD) is None
    # Behind another adapter, an LD of the same MLD keeps its own old name.
    other = attach(host, "adapter1")
    inv.replace_pool("fabric", fabric_devices(host))
    old1 = variant_name(SERIAL, "node-a", "adapter1", "cxlmem")
    assert (found := inv.lookup("fabric", old1)) is not None and found.local_id == other


def node(report: str) -> dict[str, object]:
    return {"metadata": {"annotations": {NODE_ANNOTATION: report}}}


def test_reports_read_back_old_and_new() -> None:
    keyed = NodeFabric(
        {"adapter0": "pci0000:15"}, cxlmem={cxl_key(SERIAL, "0000:16:00.0"): "adapter0"}
    )
    back = NodeFabric.from_node(node(keyed.to_annotation()))
    assert back == keyed  # the bare serial written beside the key is dropped again
    before = {"adapters": {"adapter0": "pci0000:15"}, "gpus": {}, "cxlmem": {SERIAL: "adapter0"}}
    old = json.dumps(before)  # an older plugin's report
    r = NodeFabric.from_node(node(old))
    assert r is not None and r.sees("cxlmem", SERIAL, "adapter0")
    assert r.memdevs(SERIAL, "adapter0") == [] and r.attached("cxlmem") == {SERIAL: "adapter0"}
    assert not r.sees("cxlmem", SERIAL, "adapter1")


def test_the_memdev_that_arrived() -> None:
    """The new one since the request; with no request made, the one alone there."""
    one, two = cxl_key(SERIAL, "0000:16:00.0"), cxl_key(SERIAL, "0000:16:00.1")
    both = NodeFabric(cxlmem={one: "adapter0", two: "adapter0"})
    assert memdevs.arrived(both, SERIAL, "adapter0", frozenset({one})) == two
    assert memdevs.arrived(both, SERIAL, "adapter0", frozenset()) == ""  # two new: not told
    assert memdevs.arrived(both, SERIAL, "adapter0", None) == ""  # adopted: which one?
    alone = NodeFabric(cxlmem={one: "adapter0"})
    assert memdevs.arrived(alone, SERIAL, "adapter0", None) == one
    assert memdevs.arrived(alone, SERIAL, "adapter0", frozenset({one})) == ""  # not yet
    assert memdevs.arrived(alone, SERIAL, "adapter1", None) == ""
    old = NodeFabric(cxlmem={SERIAL: "adapter0"})  # an older plugin: by serial
    assert memdevs.arrived(old, SERIAL, "adapter0", None) == ""


def test_a_released_ld_waits_only_for_its_own_memdev() -> None:
    """A busy memdev of the serial that no live allocation names keeps a
    released LD attached; one a live allocation names does not."""
    one, two = cxl_key(SERIAL, "0000:16:00.0"), cxl_key(SERIAL, "0000:16:00.1")
    ld = FabricDevice(
        "ld-1", "cxl0", "sw0", "cxlmem", "M", SERIAL, "", 0, 0, "OK", True, True, (), None,
        logical_device="0001",
    )  # fmt: skip
    kept = frozenset({("node-a", "0000:16:00.1")})  # the other claim's LD
    busy_two = NodeFabric(busy=frozenset({two, SERIAL}))
    assert not memdevs.still_prepared(busy_two, ld, "node-a", kept)
    busy_both = NodeFabric(busy=frozenset({one, two, SERIAL}))
    assert memdevs.still_prepared(busy_both, ld, "node-a", kept)
    old = NodeFabric(busy=frozenset({SERIAL}))  # an older plugin: by serial alone
    assert memdevs.still_prepared(old, ld, "node-a", kept)
    assert not memdevs.still_prepared(NodeFabric(), ld, "node-a", kept)
