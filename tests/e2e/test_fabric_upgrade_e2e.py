"""The upgrade from the per-node pool shape to per-domain, under running fabric pods.

Issue 34 step 2, "Upgrade": a cluster running the chart with
``fabricPoolShape: per-node`` has fabric claims allocated from per-node
variants, their pods running (prepared by the real node plugins); then
``helm upgrade`` sets ``fabricPoolShape: per-domain``. The controller's
Deployment rolls: the old pod is stopped (SIGTERM) and a new one starts
with the same settings but that one, as here. The nodes carry their reach
labels from provisioning before the upgrade (docs/fabric.md, "Reach
labels"; the harness labels them as provisioning would).

What it shows: the claims allocated before keep running, their devices
never detached while held; their per-node variants, and only those, stay
published in the old pool (``fabric``) until their claims go, their devices
in no domain pool meanwhile; releasing each unprepares it on its node and
detaches it exactly once; a new claim gets the per-domain shape; at the end
nothing is attached or published twice, nothing is left attached and every
device is published once in its domain pool. Without the carried variants
(``driver.controller.pool.domain_pool.carried_pool``) the old claims'
devices are offered again in the domain pools while held.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from driver.fabric_devices.naming import READY_CONDITION, NodeFabric
from tests.e2e.fabric_helpers import (
    Env,
    attr,
    claim_gone_or_free,
    conditions,
    detaches,
    fabric_slices,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import wait_for
from tests.e2e.pods import claim_of, gone, pod
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster
BEFORE, AFTER = "--fabric-pool-shape=per-node", "--fabric-pool-shape=per-domain"
# GPU_LAYOUT: sw0 holds gpu-0 and gpu-1, sw1 gpu-2 and nic-0, every node wired to both.
SW0, SW1 = "fabric/pcie0.sw0", "fabric/pcie0.sw1"


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return (BEFORE,)  # the chart before the upgrade


def cdi_spec(sim: SimNode, claim: Any) -> Path:
    """The CDI spec the node's plugin writes for ``claim`` at prepare."""
    return Path(sim.agent.cdi_root) / f"k8s.patchbay.dev-claim_{claim.metadata.uid}.json"


def held(resource_api: Any) -> list[tuple[str, str]]:
    """(pool, fabric device) of every published fabric device, sorted."""
    return sorted((s.spec.pool.name, attr(d, "fabricDevice")) for s in fabric_slices(resource_api)
                  for d in s.spec.devices or ())  # fmt: skip


def old_pool(resource_api: Any) -> set[str]:
    """The device names published in the per-node pool ``fabric``."""
    return {d.name for s in fabric_slices(resource_api) if s.spec.pool.name == "fabric"
            for d in s.spec.devices or ()}  # fmt: skip


def attaches(env: Env) -> Counter[str]:
    """Fabric device -> attach requests the fabric received."""
    return Counter(r["target"] for r in env.fabric.attach_requests())


def upgrade(env: Env) -> None:
    """``helm upgrade`` with ``fabricPoolShape: per-domain``: the old controller
    stopped, the new one started with the same settings but that one."""
    env.ctl.stop()
    env.ctl.extra = tuple(AFTER if a == BEFORE else a for a in env.ctl.extra)
    assert AFTER in env.ctl.extra
    env.ctl.start(identity="upgraded")


def test_claims_from_per_node_variants_run_through_the_upgrade_and_release_once(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, (a, b) = namespace, env.nodes
    before = [("fabric", d) for d in ("gpu-0", "gpu-1", "gpu-2", "nic-0") for _ in (a, b)]
    assert held(resource_api) == before  # the per-node shape: each device once per node
    olds = {"old-a": (a, "gpu-0"), "old-b": (b, "gpu-2")}
    for name, (sim, device) in olds.items():
        pod(core, ns, name, sim.name, template(resource_api, ns, name, [gpu_request(
            fabric_device=device)]))  # fmt: skip
    claims = {}
    for name, (sim, device) in olds.items():
        running(env, core, ns, name, timeout=150)
        claims[name] = claim_of(core, resource_api, ns, name)
        (result,) = claims[name].status.allocation.devices.results
        assert result.pool == "fabric", result  # a per-node variant
        assert env.fabric.connections()[device][:2] == (sim.name, "adapter0" if device == "gpu-0"
                                                        else "adapter1")  # fmt: skip
        assert cdi_spec(sim, claims[name]).exists()
    variants = {c.status.allocation.devices.results[0].device for c in claims.values()}
    attached = attaches(env)
    assert attached == Counter({"gpu-0": 1, "gpu-2": 1})

    upgrade(env)

    # The old claims' variants alone stay in the old pool; their devices are
    # in no domain pool; the others are published once, per domain.
    carried = [("fabric", "gpu-0"), ("fabric", "gpu-2"), (SW0, "gpu-1"), (SW1, "nic-0")]

    def settled() -> bool:
        env.check_alive()
        for device in ("gpu-0", "gpu-2"):  # never detached while held
            assert device in env.fabric.connections(), f"{device} detached while held"
        return held(resource_api) == carried

    wait_for("the old variants alone beside the domain pools", settled, timeout=60)
    assert old_pool(resource_api) == variants
    for name in olds:
        assert core.read_namespaced_pod(name, ns).status.phase == "Running"
        c = resource_api.read_namespaced_resource_claim(claims[name].metadata.name, ns)
        (result,) = c.status.allocation.devices.results
        assert conditions(c, result.device)[READY_CONDITION] == "True"

    # A new claim gets the new shape: gpu-1 from its domain pool, attached once.
    pod(core, ns, "new", a.name, template(resource_api, ns, "new", [gpu_request(
        fabric_device="gpu-1")]))  # fmt: skip
    running(env, core, ns, "new", timeout=150)
    (result,) = claim_of(core, resource_api, ns, "new").status.allocation.devices.results
    assert result.pool == SW0, result
    assert env.fabric.connections()["gpu-1"][:2] == (a.name, "adapter0")

    # Release one old claim: unprepared, detached once, then published per domain;
    # the other's variant alone stays in the old pool.
    assert detaches(env, "gpu-0") == 0
    gone(core, ns, "old-a")
    wait_for("gpu-0 detached", lambda: "gpu-0" not in env.fabric.connections(), timeout=60)
    assert not cdi_spec(a, claims["old-a"]).exists()
    rest = [("fabric", "gpu-2"), (SW0, "gpu-0"), (SW0, "gpu-1"), (SW1, "nic-0")]
    wait_for("gpu-0 in its domain pool", lambda: held(resource_api) == rest, timeout=60)
    assert "gpu-2" in env.fabric.connections() and detaches(env, "gpu-2") == 0

    # The last one: the old pool is withdrawn.
    gone(core, ns, "old-b", "new")
    once = [(SW0, "gpu-0"), (SW0, "gpu-1"), (SW1, "gpu-2"), (SW1, "nic-0")]
    wait_for("every device once, per domain", lambda: held(resource_api) == once, timeout=60)
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=60)
    assert not cdi_spec(b, claims["old-b"]).exists()
    for name in olds:
        wait_for(f"{name}'s claim gone", lambda n=name: claim_gone_or_free(
            resource_api, ns, claims[n].metadata.name), timeout=60)  # fmt: skip
    assert attaches(env) == attached + Counter({"gpu-1": 1})  # nothing attached twice
    assert {d: detaches(env, d) for d in ("gpu-0", "gpu-1", "gpu-2")} == {
        "gpu-0": 1, "gpu-1": 1, "gpu-2": 1}  # fmt: skip
    for sim in env.nodes:  # the nodes report nothing attached
        wait_for(f"{sim.name} reports nothing attached", lambda n=sim.name: reports_none(core, n),
                 timeout=60)  # fmt: skip


def reports_none(core: Any, node: str) -> bool:
    meta = core.read_node(node).metadata
    seen = NodeFabric.from_node({"metadata": {"annotations": meta.annotations}})
    return seen is not None and not seen.gpus and not seen.busy
