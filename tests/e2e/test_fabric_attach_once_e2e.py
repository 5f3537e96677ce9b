"""Each fabric allocation costs the fabric manager exactly one attach request.

The fabric's audit (``GET /patchbay/v1/audit``, outside the Redfish tree)
lists every attach request it received, whatever it answered, so a request
answered "already attached" counts as well. A count-based manager would
attach a second device for a second request: the count must be 1 for a
plain attach, and 1 when the controller is killed at each tested crash
point of the attach (``driver.faults.CONTROLLER_POINTS``) and a new
incarnation finishes it. Both attach dialects: a POST of a Connection and
a PATCH of the host port's Zone (the audit says which one came).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from driver.fabric_devices.naming import in_fabric_pool
from driver.faults import CONTROLLER_POINTS, ENV
from tests.e2e.fabric_helpers import DIALECTS, Env, gpu_request, restart, running, template
from tests.e2e.helpers import wait_for
from tests.e2e.pods import claim_of, gone, pod

pytestmark = pytest.mark.cluster
FABRIC_DIALECTS = DIALECTS


def attach_requests(env: Env) -> Counter[tuple[str, str]]:
    """(device, node) -> attach requests the fabric received, each in the env's dialect."""
    requests = env.fabric.attach_requests()
    assert {r["dialect"] for r in requests} <= {env.dialect}, requests
    return Counter((r["target"], r["initiator"].split("/", 1)[0]) for r in requests)


def run_once(
    env: Env, resource_api: Any, core: Any, ns: str, name: str, device: str, node: str,
    before: int,
) -> None:  # fmt: skip
    """A pod on ``device`` runs, its claim ready, and is deleted; the device
    detached. The fabric got one attach request more than ``before``."""
    running(env, core, ns, name, timeout=150)
    claim = claim_of(core, resource_api, ns, name)
    (result,) = claim.status.allocation.devices.results
    assert in_fabric_pool(result.pool, "fabric"), result
    assert set(env.fabric.connections()) == {device}
    assert attach_requests(env)[(device, node)] == before + 1, attach_requests(env)
    gone(core, ns, name)
    wait_for(f"{device} detached", lambda: device not in env.fabric.connections(), timeout=60)


def test_a_plain_attach_is_asked_once(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    env.fabric.faults(attachLatencySeconds=0.2)
    before = env.fabric.attach_requests()
    tmpl = template(resource_api, ns, "once", [gpu_request(fabric_device="gpu-2")])
    pod(core, ns, "once", node, tmpl)
    running(env, core, ns, "once", timeout=150)
    (asked,) = env.fabric.attach_requests()[len(before) :]
    assert (asked["target"], asked["initiator"]) == ("gpu-2", f"{node}/adapter1")
    assert asked["dialect"] == env.dialect, asked
    gone(core, ns, "once")
    wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)


@pytest.mark.parametrize("point", CONTROLLER_POINTS)
def test_an_attach_interrupted_by_a_crash_is_asked_once(
    env: Env, resource_api: Any, core: Any, namespace: str, point: str
) -> None:
    ns, node = namespace, env.nodes[1].name
    device = "gpu-1"
    before = attach_requests(env)[(device, node)]  # the earlier crash points' attaches
    # A slow attach, so that the crash while waiting for the task comes
    # before the task ends.
    env.fabric.faults(attachLatencySeconds=3)
    restart(env, f"crash-{point}", point)
    try:
        tmpl = template(resource_api, ns, "crash", [gpu_request(fabric_device=device)])
        pod(core, ns, "crash", node, tmpl)
        wait_for(f"the controller killed at {point}", lambda: not env.ctl.alive, timeout=120)
        assert attach_requests(env)[(device, node)] == before + 1
        log = env.ctl.log_tail(200)
        assert f"crash point {point} reached" in log, log
        restart(env, f"after-{point}")
        run_once(env, resource_api, core, ns, "crash", device, node, before)
    finally:
        env.fabric.faults(attachLatencySeconds=0.2)
        if not env.ctl.alive or ENV in env.ctl.env:
            restart(env, "controller-0")
