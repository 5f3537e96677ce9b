"""The fabric client against OFA Sunfish, the open composability manager (issue 35).

Sunfish (``../shared/sunfish``, as upstream ships it; started by
``tests/harness/redfish_servers.sunfish`` with its two agents, which
register and upload upstream's two-switch CXL fabric) aggregates the
agents behind one ``/redfish/v1/``. What it shows, and the client now reads:

- it answers only ``/redfish/v1/`` (with the slash);
- its Fabric links ``Endpoints`` at ``/redfish/v1/Endpoints``, its switches'
  ``Ports`` at ``/redfish/v1/Ports`` (both 404): the broken links are named
  in the inventory, and the collections read where the schema puts them;
- the fabric-manager agent's switch CXL1 carries the hosts, the appliance
  agent's CXL2 eight logical devices of one CXL memory device, joined by
  ports naming each other (``ConnectedSwitchPorts``, ``ConnectedSwitches``);
- it refuses a POST without ``@odata.type``, and has no Connections
  collection until the first is created;
- a Connection's DELETE: Sunfish forwards it to the fabric-manager agent,
  which answers 500 (its file backend removes the Connection, then walks
  every ``index.json`` of its tree to drop links to it and meets one that is
  not JSON); Sunfish turns that into ``AgentForwardingFailure``, a
  ``BaseException`` that escapes Flask, so the HTTP connection is dropped
  without an answer: no 500 reaches the client. The client's error names
  the DELETE and the URI (``FabricUnreachable``: no answer), and Sunfish
  still lists the Connection, so the device still reads attached (a detach
  reports done only when the manager shows it detached).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.controller.pool.devices import build_pool
from driver.errors import FabricUnreachable
from driver.fabricclient import FabricClient
from tests.harness.redfish_servers import sunfish
from tests.unit.mockup_pools import duplicates, names, per_domain, reports

pytestmark = pytest.mark.integration
SYSTEMS = {f"CXL-System{i}": f"node-{i}" for i in (1, 2, 3)}
SERIAL = "0x4c1d96fffeddd835"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the harness runs Sunfish and its agents (their logs: ``<app>.log``)."""
    return tmp_path_factory.mktemp("sunfish")


@pytest.fixture(scope="module")
def service(work: Path) -> Iterator[str]:
    with sunfish(work) as url:
        yield url


async def test_memory_targets_have_unique_identities_across_two_switches(service: str) -> None:
    async with FabricClient(service, "unused", systems=SYSTEMS) as fc:
        inv = await fc.inventory()
    memory = [d for d in inv.devices if d.kind == "cxlmem"]
    assert sorted(d.id for d in memory) == [f"VT1.{i}" for i in range(1, 9)]
    assert {d.unique_identity for d in memory} == {f"{SERIAL}:{i:04d}" for i in range(1, 9)}
    assert {d.switch for d in memory} == {"CXL2"}
    assert {a.switch for a in inv.adapters} == {"CXL1"}
    for d in memory:  # through the inter-switch links
        assert sorted(a.node for a in d.adapters) == ["node-1", "node-2", "node-3"], d.id
    # The broken links are named; the rest is kept.
    broken = dict(inv.broken)
    assert "GET /redfish/v1/Endpoints: HTTP 404" in broken["/redfish/v1/Endpoints"]
    assert "GET /redfish/v1/Ports: HTTP 404" in broken["/redfish/v1/Ports"]
    assert inv.held_back == ()


async def test_every_name_is_unique_in_the_pool_built_in_both_shapes(service: str) -> None:
    """Sunfish's eight LDs of one memory device: a variant of each per node and
    adapter (per-node), each once (per-domain), every name once in its pool
    (before, the eight shared one name per node and adapter)."""
    async with FabricClient(service, "unused", systems=SYSTEMS) as fc:
        inv = await fc.inventory()
    nodes = reports(inv)
    spec, variants = build_pool("fabric", inv, nodes, (), ())
    assert duplicates(names([spec])) == {}
    reach = {(d.id, a.node, a.adapter) for d in inv.devices if d.identity for a in d.adapters}
    assert {(v.device_id, v.node, v.adapter) for v in variants.values()} == reach
    pools = names(per_domain("fabric", inv))
    assert duplicates(pools) == {}
    published = [n for p, ns in pools.items() if "/adapters/" not in p for n in ns]
    assert len(published) == len({d.id for d in inv.devices if d.identity and d.available}) >= 8


async def test_attach_reads_back_attached_and_the_failed_detach_is_named(
    service: str, work: Path
) -> None:
    async with FabricClient(service, "unused", systems=SYSTEMS) as fc:
        assert (await fc.device("VT1.3")).connection is None
        result = await fc.attach("VT1.3", "node-2", "I2")
        assert result.task is None
        conn = (await fc.device("VT1.3")).connection
        assert conn is not None and (conn.node, conn.adapter, conn.state) == (
            "node-2", "I2", "Attached",
        )  # fmt: skip
        assert conn.uri == result.connection_uri
        with pytest.raises(FabricUnreachable) as exc:
            await fc.detach("VT1.3")
        # Not done: Sunfish still lists the Connection, the device reads attached.
        after = (await fc.device("VT1.3")).connection
        assert after is not None and (after.uri, after.state) == (conn.uri, "Attached")
    # No answer came (the connection dropped): the error names the DELETE and the URI.
    message = str(exc.value)
    assert message.startswith(f"fabric DELETE {conn.uri}: ServerDisconnected"), message
    assert "500" not in message
    # What happened behind it: the agent answered Sunfish's forwarded DELETE 500.
    agent = (work / "app_fabric_mgr.py.log").read_text()
    forwarded = re.compile(
        "AgentForwardingFailure: Agent forwarding failure while deleting object "
        rf"http://127\.0\.0\.1:\d+/{re.escape(conn.uri)} \. Error code: 500\. "
    )
    told = forwarded.findall((work / "app_sunfish_server.py.log").read_text())
    assert len(told) == 1, "Sunfish's forwarding did not fail on the agent's 500"
    assert f"Exception on {conn.uri} [DELETE]" in agent
