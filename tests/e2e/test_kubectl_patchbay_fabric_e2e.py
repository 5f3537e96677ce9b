"""``kubectl patchbay claims`` and ``fabric`` on the fabric e2e environment.

The environment of tests/e2e/conftest.py (two GPU-less nodes with two
adapters, the real ``patchbay-fabric`` and ``patchbay-controller``): a claim
whose only device fails its attach (``failNextAttaches``), which the
scheduler deallocates and the controller withholds for its hold time, and a
claim waiting in PreBind for a slow attach. The installed console script
reads both from the API alone: the waiting one's binding state and wait,
the failed one's reason, the pool's held, free and withheld devices, and
where the attached device is once the node reports it.

In the default shape (per-domain) the withheld device is published nowhere
and has no counter: the view lists it from the Warnings that say it is held
(``driver.fabric_devices.holds``), with until when.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pytest

from driver.fabric_devices.naming import in_fabric_pool
from tests.e2e.fabric_helpers import (
    Env,
    gpu_request,
    running,
    template,
)
from tests.e2e.helpers import wait_for
from tests.e2e.kubectl_views import fabric, kubectl_patchbay
from tests.e2e.pods import claim_of, gone, pod
from tests.harness.cluster import LocalCluster

pytestmark = pytest.mark.cluster


def claims(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    """The claims view of ``ns`` by pod name."""
    rows = json.loads(kubectl_patchbay(cluster, "claims", "-n", ns, "-o", "json"))
    return {p: r for r in rows for p in r["pods"]}


def test_claims_and_fabric_show_a_failed_attach_and_a_waiting_one(
    env: Env, local_cluster: LocalCluster, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, node = namespace, env.nodes[0].name
    env.fabric.faults(failNextAttaches=1)
    doomed = template(resource_api, ns, "only-gpu-1", [gpu_request(fabric_device="gpu-1")])
    pod(core, ns, "doomed", node, doomed)

    def failed() -> dict[str, Any] | None:
        env.check_alive()
        row = claims(local_cluster, ns).get("doomed")
        return row if row and row["lastError"] and row["state"] == "pending" else None

    row = wait_for("the failed attach in the claims view", failed, timeout=90)
    # The scheduler's binding failure (or the controller's Event on the
    # claim) carries the fabric's message, which names the device.
    err = row["lastError"]
    assert "gpu-1" in err["message"] and "AttachFailed" in err["reason"] + err["message"], err
    assert row["devices"] == [], "the scheduler cleared the failed allocation"
    pool = fabric(local_cluster)
    assert pool["gpu-1"]["state"] == "withheld" and pool["gpu-1"]["reachable"] == []
    assert "gpu-1" in pool["gpu-1"]["why"]["message"]
    # Until when, from the Warnings (the arithmetic is unit-tested; no clock here).
    hold = pool["gpu-1"]["hold"]
    assert datetime.fromisoformat(hold["until"].replace("Z", "+00:00")) and "secondsLeft" in hold
    assert pool["gpu-0"]["state"] == "free" and len(pool["gpu-0"]["reachable"]) == 2

    # The attach is held (a latency the fabric re-reads while it waits) until
    # every view of it was taken, however slowly kubectl runs here.
    env.fabric.faults(attachLatencySeconds=600)
    try:
        slow = template(resource_api, ns, "only-gpu-0", [gpu_request(fabric_device="gpu-0")])
        pod(core, ns, "slow", node, slow)
        wait_for("gpu-0 attaching", lambda: "gpu-0" in env.fabric.connections(), timeout=60)
        row = claims(local_cluster, ns)["slow"]
        (dev,) = row["devices"]
        assert (
            in_fabric_pool(dev["pool"], "fabric") and dev["type"] == "gpu" and row["node"] == node
        )
        assert dev["binding"]["state"] == "attaching" and "seconds" in dev["binding"]
        assert row["state"] == "reserved", "the scheduler reserves it before PreBind waits"
        text = kubectl_patchbay(local_cluster, "claims", "-n", ns, "-o", "wide")
        print(text)
        name = claim_of(core, resource_api, ns, "slow").metadata.name
        (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
        assert re.search(rf"{re.escape(dev['pool'])}/{dev['device']}\s+attaching ", line), line
        (failed_line,) = [x for x in text.splitlines() if x.rstrip().endswith(err["message"])]
        assert failed_line.split()[1] == "pending"
        pool = fabric(local_cluster)
        held = pool["gpu-0"]["holder"]
        assert pool["gpu-0"]["state"] == "held" and held["binding"]["state"] == "attaching"
        # Published once (per-domain), the variant names no node: the holder's node
        # is the allocation's; the adapter is the controller's pick, in no object
        # the view reads until the node reports the device there (ATTACHED, below).
        assert (held["node"], held["adapter"]) == (node, None) and held["claim"].endswith(
            "/" + name
        )
        table = kubectl_patchbay(local_cluster, "fabric")
        print(table)
        (g0,) = [x for x in table.splitlines() if x.startswith("gpu-0 ")]
        assert g0.split()[2:4] == ["held,", "attaching"]
        # Attached: the node reports it behind adapter0, held by the prepared claim.
        env.fabric.faults(attachLatencySeconds=0.2)
        running(env, core, ns, "slow")
        g0_view = fabric(local_cluster)["gpu-0"]
        assert g0_view["attached"] == {"node": node, "adapter": "adapter0", "busy": True}
        assert g0_view["holder"]["binding"]["state"] == "ready"
        assert claims(local_cluster, ns)["slow"]["devices"][0]["binding"]["state"] == "ready"
    finally:
        env.fabric.faults(attachLatencySeconds=0.2)
        gone(core, ns, "slow", "doomed")
    wait_for("nothing attached", lambda: not env.fabric.connections(), timeout=90)
