"""Warm spares on a real cluster: the real controller, fabric and scheduler.

Six fabric GPUs reach both simulated nodes (sw0: gpu-0..gpu-3 behind
adapter0, sw1: gpu-4, gpu-5 behind adapter1). The controller keeps one
spare per node (fixed), two on a node after an allocation there
(demand-driven), at most half the pool (3), and detaches a spare above the
fixed one after 60 s idle (docs/fabric.md, "Warm spares"). The tests run in
order, each from the state the one before left:

- a restarted controller keeps the spares: the fabric audit shows no new
  attach and no connection goes;
- a pod that asks for a spare runs with no binding conditions in its
  allocation, no attach request, and the spare is replaced;
- with both nodes' demand windows open (4 wanted), the spares stop at 3;
- a claim on the other node that only a spare's device can serve gets it:
  the spare is detached and the device attached there;
- the spares above the fixed one leave once idle past their timeout.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.fabric_helpers import (
    Env,
    FabricLayout,
    SwitchLayout,
    attr,
    fabric_pool,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import wait_for
from tests.e2e.pods import claim_of, pod

pytestmark = pytest.mark.cluster

MODEL = "H100-SXM5-80GB"  # the simulator's GPUs (tests/harness/fabricsim.py)
CAP = 3  # --spares-cap=0.5 of 6 GPUs
IDLE_S = 60
# Local GPUs have no such attribute: the expression a class that prefers spares uses.
SPARE_CEL = (
    '"spare" in device.attributes["patchbay.dev"] && device.attributes["patchbay.dev"].spare'
)


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return FabricLayout(
        (
            SwitchLayout("sw0", "adapter0", gpus=("gpu-0", "gpu-1", "gpu-2", "gpu-3")),
            SwitchLayout("sw1", "adapter1", gpus=("gpu-4", "gpu-5")),
        )
    )


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return (
        "--fabric-pool-shape=per-node",  # spares as per-node variants (per-domain: domain e2e)
        f"--spares-fixed=gpu:{MODEL}=1",
        "--spares-demand=gpu:*=2",
        "--spares-demand-window=600",
        "--spares-cap=0.5",
        f"--spares-idle-timeout={IDLE_S}",
    )


def spares(resource_api: Any) -> dict[str, tuple[str, str]]:
    """Fabric device -> (node, variant) of every variant published as a spare;
    each without binding conditions (asserted)."""
    out = {}
    for name, d in fabric_pool(resource_api).items():
        if d.attributes["spare"].bool:
            assert not d.binding_conditions and not d.binds_to_node, d
            out[str(attr(d, "fabricDevice"))] = (d.node_name, name)
    return out


def on(resource_api: Any, node: str) -> list[str]:
    return sorted(dev for dev, (n, _) in spares(resource_api).items() if n == node)


def metric(env: Env, name: str, **labels: str) -> float | None:
    """The controller's sample; None while it does not serve (a restart)."""
    (arg,) = [a for a in env.ctl.extra if a.startswith("--metrics-port=")]
    try:
        url = f"http://127.0.0.1:{arg.split('=', 1)[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            families = list(text_string_to_metric_families(r.read().decode()))
    except OSError:
        return None
    want = set(labels.items())
    for f in families:
        for s in f.samples:
            if s.name == name and want <= set(s.labels.items()):
                return float(s.value)
    return None


def settled(env: Env, ready: int) -> Callable[[], bool]:
    """The controller's spares: ``ready`` of them, none attaching."""
    return lambda: (
        metric(env, "patchbay_fabric_spares", state="ready") == ready
        and metric(env, "patchbay_fabric_spares", state="attaching") == 0
    )


def attaches(env: Env) -> list[tuple[str, str]]:
    """(device, node) of every attach request the fabric got, in order."""
    return [(r["target"], r["initiator"].split("/", 1)[0]) for r in env.fabric.attach_requests()]


def test_fixed_spares_are_published_without_binding_conditions(env: Env, resource_api: Any) -> None:
    a, b = (n.name for n in env.nodes)
    wait_for(
        "a spare on each node",
        lambda: len(on(resource_api, a)) == len(on(resource_api, b)) == 1,
        timeout=90,
    )
    assert set(env.fabric.connections()) == set(spares(resource_api))


def test_a_restart_keeps_the_spares(env: Env, resource_api: Any) -> None:
    wait_for("the fixed spares settled", settled(env, 2), timeout=90)
    kept, connected, asked = spares(resource_api), env.fabric.connections(), attaches(env)
    assert len(kept) == 2
    env.ctl.kill()
    env.ctl.start(identity="controller-restarted")
    # The new process's own gauge: its passes adopted them.
    wait_for("the restarted controller's spares", settled(env, len(kept)), timeout=90)
    assert spares(resource_api) == kept
    assert attaches(env) == asked  # no new attach
    assert env.fabric.connections() == connected  # none detached


def test_a_pod_takes_a_spare_and_it_is_replaced(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    wait_for("a spare on node 0", lambda: len(on(resource_api, node)) == 1, timeout=90)
    (taken,) = on(resource_api, node)
    before = attaches(env)
    req = gpu_request()
    req["exactly"]["selectors"] = [{"cel": {"expression": SPARE_CEL}}]
    pod(core, ns, "taker", node, template(resource_api, ns, "spare", [req]))
    running(env, core, ns, "taker")
    claim = claim_of(core, resource_api, ns, "taker")
    (result,) = claim.status.allocation.devices.results
    assert result.pool == "fabric" and not result.binding_conditions, result
    assert env.fabric.connections()[taken][0] == node
    assert (taken, node) not in attaches(env)[len(before) :]  # no attach: it was there
    # Replaced, and the allocation opened node 0's demand window: two spares there.
    wait_for("two new spares on node 0", lambda: len(on(resource_api, node)) == 2, timeout=90)
    assert taken not in spares(resource_api)
    assert (metric(env, "patchbay_fabric_spare_allocations_total", result="hit") or 0) >= 1


def test_spares_never_exceed_the_cap(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[1].name
    seen: list[int] = []

    def count() -> int:
        n = len(spares(resource_api))
        seen.append(n)
        return n

    pod(core, ns, "other", node, template(resource_api, ns, "gpu", [gpu_request()]))
    running(env, core, ns, "other")
    # Node 1's window is open too: 2 + 2 wanted, the cap allows 3.
    wait_for("the spares settled", lambda: settled(env, CAP)() and count() == CAP, timeout=90)
    assert max(seen) <= CAP, seen


def test_a_claim_on_another_node_gets_a_spares_device(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns = namespace
    a, b = (n.name for n in env.nodes)
    wait_for("a spare on node 0", lambda: bool(on(resource_api, a)), timeout=90)
    device = on(resource_api, a)[0]
    pod(
        core,
        ns,
        "across",
        b,
        template(resource_api, ns, "one", [gpu_request(fabric_device=device)]),
    )
    running(env, core, ns, "across", timeout=150)
    assert env.fabric.connections()[device][0] == b
    assert (device, b) in attaches(env)
    claim = claim_of(core, resource_api, ns, "across")
    (result,) = claim.status.allocation.devices.results
    assert result.binding_conditions == ["FabricDeviceReady"]  # it waited for the attach


def test_idle_spares_above_the_fixed_one_leave(env: Env, resource_api: Any) -> None:
    a, b = (n.name for n in env.nodes)
    # A retired spare leaves the pool before its detach ends (docs/fabric.md):
    # the wait includes the fabric's connections, the signal that it ended.
    wait_for(
        f"one spare per node after {IDLE_S}s idle, the others detached",
        lambda: (
            len(on(resource_api, a)) == len(on(resource_api, b)) == 1
            and settled(env, 2)()
            and set(env.fabric.connections()) == set(spares(resource_api))
        ),
        timeout=IDLE_S * 3,
    )
