"""Two logical devices of one CXL memory device on one node, on the real control plane.

A CXL fabric (tests/e2e/conftest.py builds the env, this module's layout):
switch sw0 holds one multi-logical device, mld-0, of two LDs (endpoints
mld-0-ld0 and mld-0-ld1, 32 GiB each, one serial) behind adapter0 of both
nodes. Two pods on one node each ask for ``cxl-memory.patchbay.dev``: the
scheduler gives each its own LD, the controller attaches both through the
one adapter, and the simulated host shows each as Linux does, its own memdev
at its own BDF with the shared serial. Each claim's status names the memdev
its LD arrived as (issue 35: the node tells the LDs apart by memdev, not by
serial), and each container gets that memdev's dax device. That it is the
right one shows on release: the first pod's LD is detached while the second
still runs, and the memory that leaves the host is the first's, not the
second's.
"""

from __future__ import annotations

from typing import Any

import pytest

from driver.cxl.discovery import memories
from driver.devices.model import PCI_BUS_ID
from driver.fabric_devices.naming import (
    NodeFabric,
    cxl_bdf_of,
    cxl_key,
    in_fabric_pool,
    variant_name,
)
from tests.e2e.fabric_helpers import (
    Env,
    FabricLayout,
    SwitchLayout,
    fabric_pool,
    running,
    template,
)
from tests.e2e.helpers import wait_for
from tests.e2e.pods import claim_of, gone, pod
from tests.e2e.tenants import container_record

pytestmark = pytest.mark.cluster
LAYOUT = FabricLayout((SwitchLayout("sw0", "adapter0", cxlmems=("mld-0",), lds=2),), type="CXL")
LD_BYTES = 32 << 30  # tests/harness/fabricsim.switch's 64 GiB, split in two
PODS = ("first", "second")


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return LAYOUT


def report(core: Any, node: str) -> NodeFabric:
    meta = core.read_node(node).metadata
    seen = NodeFabric.from_node({"metadata": {"annotations": meta.annotations}})
    assert seen is not None, f"{node} reports no fabric annotation"
    return seen


def on_host(sim: Any) -> dict[str, str]:
    """The node's CXL memory now: dax device path -> its memdev's BDF."""
    return {f"/dev/{m.dax.name}": m.bdf for m in memories(sim.host.sysfs_root)}


def test_two_lds_of_one_mld_on_one_node_each_prepared_as_its_own(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    sim, ns = env.nodes[0], namespace
    for name in PODS:
        request = {"name": "mem", "exactly": {"deviceClassName": "cxl-memory.patchbay.dev"}}
        pod(core, ns, name, sim.name, template(resource_api, ns, name, [request]))
    for name in PODS:
        running(env, core, ns, name)
    conns, memory = env.fabric.connections(), on_host(sim)
    got: dict[str, tuple[str, str, str]] = {}  # pod -> (LD, memdev BDF, dax path)
    for name in PODS:
        claim = claim_of(core, resource_api, ns, name)
        (entry,) = [d for d in claim.status.devices or [] if in_fabric_pool(d.pool, "fabric")]
        data = entry.data
        device, bdf = data["fabricDevice"], data[PCI_BUS_ID]
        assert conns[device][:2] == (sim.name, "adapter0")
        key = cxl_key(data["serial"], bdf)
        assert data["preparedAs"] == variant_name(key, sim.name, "adapter0", "cxlmem")
        container = container_record(sim, ns, name)
        (dax,) = [n["path"] for n in container["deviceNodes"]]
        env_vars = dict(e.split("=", 1) for e in container["env"])
        assert env_vars["PATCHBAY_CXL_DEVICES"] == dax
        assert env_vars["PATCHBAY_CXL_SIZE_0"] == str(LD_BYTES)
        assert memory[dax] == bdf  # the container has the memdev its claim names
        got[name] = (device, bdf, dax)
    assert sorted(g[0] for g in got.values()) == ["mld-0-ld0", "mld-0-ld1"]
    assert len({g[1] for g in got.values()}) == 2 and len({g[2] for g in got.values()}) == 2
    seen = report(core, sim.name)
    assert sorted(cxl_bdf_of(k) for k in seen.cxlmem) == sorted(g[1] for g in got.values())
    # The right one: the first pod's LD leaves, and with it the first's memory only.
    (first_ld, first_bdf, first_dax), (second_ld, _, second_dax) = got["first"], got["second"]
    gone(core, ns, "first")
    wait_for(
        f"{first_ld} detached",
        lambda: env.check_alive() and first_ld not in env.fabric.connections(),
        timeout=60,
    )
    wait_for(f"{first_dax} gone from the host", lambda: first_dax not in on_host(sim), timeout=30)
    assert on_host(sim) == {second_dax: got["second"][1]}
    assert env.fabric.connections()[second_ld][:2] == (sim.name, "adapter0")
    assert core.read_namespaced_pod("second", ns).status.phase == "Running"
    gone(core, ns, "second")
    wait_for(
        "both detached, the pool whole again",
        lambda: not env.fabric.connections() and len(fabric_pool(resource_api)) == env.pool_size,
        timeout=60,
    )
    assert first_bdf not in on_host(sim).values()
