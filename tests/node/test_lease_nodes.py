"""Idle devices and the lease's state on real nodes (issue 37's node tier).

The e2e tier writes ``Idle`` on a claim as the plugin would; here the real
plugin does, in its pod, with the chart's RBAC and its own pod-bound token
(the only identity the apiserver lets write a device condition on a claim of
its node: ``associated-node``). The tier installs the chart with a short
idle window and the lease clock on (``tests/node/conftest.py``); each test
runs under a DeviceLeasePolicy that selects its namespace alone and
reclaims idle devices, and reads what a user sees: the claim's conditions
and annotations, Events, pods going, and the plugin's own gauges.

How busy a GPU is comes from the node's NVML mock (``NvmlStateFile``):
every GPU of node-a is busy while a test runs, except the ones it sets
to 0 %. Time is never measured here: "two windows passed" is the
plugin's ``patchbay_device_idle_seconds`` of a GPU at 0 % in the same claim
(a witness, read in the same sampling rounds as the devices under test).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families

from fabric.simhost.host import SimHost
from tests.e2e.helpers import wait_for
from tests.node.helpers import IDLE_WINDOW_S, RELEASE_NS, UUID, Tier, attr, example

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

NODE = "node-a"
BUSY, LOW = 90, 0  # percent; the node's threshold is the chart's 5 %
RULE = {"utilizationBelowPercent": 10, "for": f"{IDLE_WINDOW_S:g}s", "action": "Reclaim"}
LEASE_STATE = ("patchbay.dev/lease-holder", "patchbay.dev/lease-start", "patchbay.dev/lease-expiry")
METRICS = (
    "import urllib.request as u; print(u.urlopen('http://127.0.0.1:{}/metrics').read().decode())"
)


@pytest.fixture
def busy_node(tier: Tier) -> Iterator[SimHost]:
    """node-a's simulated host with every GPU busy; all back to 0 % (the
    tier's default) after the test, so no GPU a test set low stays low for
    the next one."""
    host = SimHost.open(tier.nodes[NODE].real.sim_dir)
    gpus = [g["uuid"] for g in host.nvml.read()["gpus"]]
    for gpu in gpus:
        host.nvml.set_utilization(gpu, BUSY)
    try:
        yield host
    finally:
        for gpu in gpus:
            host.nvml.set_utilization(gpu, 0)


@pytest.fixture
def leased(tier: Tier, namespace: str, busy_node: SimHost) -> Iterator[str]:
    """``namespace`` under a policy of its own: a lease by default, idle devices reclaimed."""
    label = namespace
    tier.kubectl("label", "namespace", namespace, f"idle-team={label}")
    name = f"idle-{uuid.uuid4().hex[:8]}"
    policy = {
        "apiVersion": "patchbay.dev/v1alpha1", "kind": "DeviceLeasePolicy",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {"idle-team": label}},
                 "deviceClassNames": ["gpu.patchbay.dev", "vf.patchbay.dev"],
                 "defaultDuration": "1h", "maxDuration": "2h",
                 "evictionGracePeriodSeconds": 1, "idle": RULE},
    }  # fmt: skip
    tier.apply(namespace, [policy])
    try:
        yield name
    finally:
        tier.kubectl("delete", "deviceleasepolicy", name, "--ignore-not-found")


def pod(name: str, claim: dict[str, str]) -> dict[str, Any]:
    """The single-GPU example's pod on node-a, on ``claim`` (a template or a claim)."""
    out = copy.deepcopy(example("single-gpu.yaml")[1])
    out["metadata"]["name"] = name
    out["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    out["spec"]["resourceClaims"] = [{"name": "dev", **claim}]
    out["spec"]["containers"][0]["resources"]["claims"] = [{"name": "dev"}]
    return dict(out)


def template(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {"devices": {"requests": requests}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": spec}}  # fmt: skip


def request(name: str, cls: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": f"{cls}.patchbay.dev"}}


def results(claim: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """request -> (pool, device) of the claim's allocation."""
    got = claim["status"]["allocation"]["devices"]["results"]
    return {r["request"]: (r["pool"], r["device"]) for r in got}


def idle(claim: dict[str, Any], key: tuple[str, str]) -> dict[str, Any] | None:
    """The device's ``Idle`` condition on the claim, None when it has none."""
    for d in claim.get("status", {}).get("devices", []):
        if (d["driver"], d["pool"], d["device"]) == ("patchbay.dev", *key):
            for c in d.get("conditions") or []:
                if c["type"] == "Idle":
                    return dict(c)
    return None


def gpu_uuid(tier: Tier, key: tuple[str, str]) -> str:
    return str(attr(tier.devices_by_name()[key], UUID))


def idle_seconds(tier: Tier, ns: str, claim: str, device: str) -> float:
    """The plugin's ``patchbay_device_idle_seconds`` of one device (0 before its first round)."""
    plugin = tier.plugin_pod_on(NODE)
    port = next(p["containerPort"] for c in plugin["spec"]["containers"]
                for p in c.get("ports", []) if p.get("name") == "metrics")  # fmt: skip
    text = tier.kubectl("exec", "-n", RELEASE_NS, plugin["metadata"]["name"], "-c", "plugin",
                        "--", "python3", "-c", METRICS.format(port))  # fmt: skip
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = (s.labels.get("namespace"), s.labels.get("claim"), s.labels.get("device"))
            if s.name == "patchbay_device_idle_seconds" and labels == (ns, claim, device):
                return float(s.value)
    return 0.0


def told(tier: Tier, ns: str, name: str) -> list[str]:
    """The lease Events about ``name``, oldest first."""
    ours = [e for e in tier.events(ns, name)
            if e["reason"].startswith(("Lease", "Idle", "DevicesIdle"))]  # fmt: skip
    ours.sort(key=lambda e: e.get("eventTime") or e.get("firstTimestamp")
              or e["metadata"]["creationTimestamp"])  # fmt: skip
    return [e["reason"] for e in ours]


def gone(tier: Tier, ns: str, kind: str, name: str) -> bool:
    return not tier.kubectl("get", kind, name, "-n", ns, "--ignore-not-found", "-o", "name")


def first_idle(
    tier: Tier, ns: str, name: str, key: tuple[str, str], timeout: float
) -> dict[str, Any]:  # fmt: skip
    """The device's first ``Idle=True`` on claim ``name``, from a listing and
    a watch from its resourceVersion (the claim may be reclaimed and gone a
    moment later: no version of it is missed)."""
    api = config.new_client_from_config(config_file=str(tier.cluster.kubeconfig))

    def marked(obj: dict[str, Any]) -> dict[str, Any] | None:
        cond = idle(obj, key)
        return cond if cond is not None and cond["status"] == "True" else None

    try:  # as plain objects: the client's watch has no model for a v1 claim
        custom = client.CustomObjectsApi(api)
        where = ("resource.k8s.io", "v1", ns, "resourceclaims")
        query = {"field_selector": f"metadata.name={name}"}
        listing = custom.list_namespaced_custom_object(*where, **query)
        for obj in listing["items"]:
            if cond := marked(obj):
                return cond
        stream = watch.Watch().stream(
            custom.list_namespaced_custom_object, *where, timeout_seconds=int(timeout),
            resource_version=listing["metadata"]["resourceVersion"], **query,
        )  # fmt: skip
        for event in stream:
            if cond := marked(event["object"]):
                return cond
    finally:
        api.close()
    pytest.fail(f"no Idle=True on {ns}/{name} {key} within {timeout:.0f}s", pytrace=False)


def two_windows_low(tier: Tier, ns: str, pod: str, witness: str, never: tuple[str, str]) -> None:
    """Wait until the plugin has had ``witness`` (a GPU at 0 % of ``pod``'s
    claim) below its threshold for two idle windows: every device of the
    claim was sampled in those rounds. Fails at once, saying so, when the
    device ``never`` is marked idle or the claim is reclaimed meanwhile."""

    def probe() -> bool:
        try:
            claim = tier.claim_of(ns, pod)
        except pytest.fail.Exception:  # the pod went between two reads
            claim = {}
        if not claim or gone(tier, ns, "pod", pod):
            pytest.fail(f"pod {pod} gone (reclaimed?): {told(tier, ns, pod)}", pytrace=False)
        if idle(claim, never) is not None:
            pytest.fail(f"{never} marked {idle(claim, never)}", pytrace=False)
        name = claim["metadata"]["name"]
        return idle_seconds(tier, ns, name, witness) >= 2 * IDLE_WINDOW_S

    wait_for(f"{witness} low for two idle windows (the plugin's gauge)", probe,
             timeout=6 * IDLE_WINDOW_S + 60, interval=1)  # fmt: skip


def test_an_idle_gpu_gets_idle_and_its_pod_is_evicted(
    tier: Tier, namespace: str, leased: str, busy_node: SimHost
) -> None:
    ns = namespace
    tier.apply(ns, [template("one-gpu", [request("gpu", "gpu")]),
                    pod("notebook", {"resourceClaimTemplateName": "one-gpu"})])  # fmt: skip
    tier.running(ns, "notebook")
    claim = tier.claim_of(ns, "notebook")
    name = claim["metadata"]["name"]
    key = results(claim)["gpu"]
    wait_for("the lease started", lambda: told(tier, ns, name) == ["LeaseStarted"], timeout=60)
    busy_node.nvml.set_utilization(gpu_uuid(tier, key), LOW)

    cond = first_idle(tier, ns, name, key, timeout=4 * IDLE_WINDOW_S + 60)
    assert cond["reason"] == "BelowThreshold", cond
    assert f"utilization below 5% for {IDLE_WINDOW_S:g}s" in cond["message"], cond
    wait_for("the pod evicted", lambda: gone(tier, ns, "pod", "notebook"), timeout=90)
    wait_for("its claim released", lambda: gone(tier, ns, "resourceclaim", name), timeout=60)
    assert told(tier, ns, name) == ["LeaseStarted", "IdleReclaimed"]
    assert "IdleReclaimed" in told(tier, ns, "notebook")
    (reclaimed,) = [e for e in tier.events(ns, name) if e["reason"] == "IdleReclaimed"]
    assert f"devices {key[0]}/{key[1]} of " in reclaimed["message"], reclaimed
    assert f"DeviceLeasePolicy {leased} idle.for {RULE['for']}" in reclaimed["message"]


def test_a_busy_gpu_is_never_idle_nor_reclaimed(
    tier: Tier, namespace: str, leased: str, busy_node: SimHost
) -> None:
    ns = namespace
    tier.apply(ns, [template("gpus", [request("busy", "gpu"), request("witness", "gpu")]),
                    pod("trainer", {"resourceClaimTemplateName": "gpus"})])  # fmt: skip
    tier.running(ns, "trainer")
    claim = tier.claim_of(ns, "trainer")
    name, keys = claim["metadata"]["name"], results(claim)
    busy_node.nvml.set_utilization(gpu_uuid(tier, keys["witness"]), LOW)
    two_windows_low(tier, ns, "trainer", keys["witness"][1], keys["busy"])
    now = tier.claim_of(ns, "trainer")
    assert idle(now, keys["busy"]) is None, now["status"]["devices"]
    # The plugin did report: the witness is idle; the busy GPU keeps the claim.
    assert (idle(now, keys["witness"]) or {}).get("status") == "True", now["status"]
    assert tier.pod(ns, "trainer")["status"]["phase"] == "Running"
    assert "deletionTimestamp" not in now["metadata"]
    assert told(tier, ns, name) == ["LeaseStarted"]
    tier.delete_pod(ns, "trainer")


def test_a_device_without_a_utilization_source_is_never_idle(
    tier: Tier, namespace: str, leased: str, busy_node: SimHost
) -> None:
    ns = namespace
    tier.apply(ns, [template("vf", [request("nic", "vf"), request("witness", "gpu")]),
                    pod("net", {"resourceClaimTemplateName": "vf"})])  # fmt: skip
    tier.running(ns, "net")
    claim = tier.claim_of(ns, "net")
    name, keys = claim["metadata"]["name"], results(claim)
    busy_node.nvml.set_utilization(gpu_uuid(tier, keys["witness"]), LOW)
    two_windows_low(tier, ns, "net", keys["witness"][1], keys["nic"])
    now = tier.claim_of(ns, "net")
    assert idle(now, keys["nic"]) is None, now["status"]["devices"]
    assert (idle(now, keys["witness"]) or {}).get("status") == "True", now["status"]
    assert tier.pod(ns, "net")["status"]["phase"] == "Running"
    assert told(tier, ns, name) == ["LeaseStarted"]
    tier.delete_pod(ns, "net")


def test_a_user_with_edit_cannot_change_the_lease(
    tier: Tier, namespace: str, leased: str
) -> None:  # fmt: skip
    ns = namespace
    tier.kubectl("create", "rolebinding", "alice-edit", "-n", ns, "--clusterrole=edit",
                 "--user=alice")  # fmt: skip
    spec = {"devices": {"requests": [request("nic", "vf")]}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "vf"}, "spec": spec}  # fmt: skip
    tier.kubectl("apply", "-n", ns, "--as=alice", "-f", "-", stdin=json.dumps(claim))
    tier.apply(ns, [pod("holder", {"resourceClaimName": "vf"})])
    tier.running(ns, "holder")

    def stamped() -> dict[str, str] | None:
        notes = tier.get("resourceclaim", "vf", "-n", ns)["metadata"].get("annotations", {})
        return notes if all(k in notes for k in LEASE_STATE) else None

    before = wait_for("the lease stamped on the claim", stamped, timeout=60)
    assert before["patchbay.dev/lease-holder"] == "alice"
    for key in LEASE_STATE:
        change = f"{key}=2099-01-01T00:00:00Z"
        proc = tier.cluster.kubectl("annotate", "resourceclaim", "vf", "-n", ns, "--as=alice",
                                    "--overwrite", change, check=False)  # fmt: skip
        assert proc.returncode != 0, key
        assert f"the lease state of ResourceClaim {ns}/vf is written by patchbay only" in (
            proc.stderr
        ), proc.stderr
        assert f"metadata.annotations[{key}] may not be set or changed by alice" in proc.stderr
    # alice may change the rest (edit is hers): the refusal is the lease's guard, not RBAC.
    tier.kubectl("annotate", "resourceclaim", "vf", "-n", ns, "--as=alice", "note=mine")
    after = tier.get("resourceclaim", "vf", "-n", ns)["metadata"]["annotations"]
    assert {k: after[k] for k in LEASE_STATE} == {k: before[k] for k in LEASE_STATE}
    tier.delete_pod(ns, "holder")
