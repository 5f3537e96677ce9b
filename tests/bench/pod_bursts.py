"""Bursts of pods with claims, timed by a watch: the round both scheduler
benches run.

Why: ``sched_bench`` (fabric pool sizes) and ``scale_bench`` (node counts)
time the same thing, a burst of pods each with a claim from one template,
from creation to bound or to claim allocated, and then clear the round; one
copy keeps what a "done" pod means and how a round is cleared the same in
both.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

NS = "bench"
Obj = dict[str, Any]


class Stamps(threading.Thread):
    """When each object (by key) first met `ready`, from a watch on the namespace."""

    def __init__(
        self, list_fn: Callable[..., Any], key: Callable[[Obj], str | None],
        ready: Callable[[Obj], bool],
    ) -> None:  # fmt: skip
        super().__init__(name="stamps", daemon=True)
        self.list_fn, self.key, self.ready = list_fn, key, ready
        self.seen: dict[str, float] = {}
        self.error: str | None = None
        self.rv = list_fn(NS).metadata.resource_version
        self._halt = threading.Event()

    def run(self) -> None:
        # A raw watch: the client's Watch cannot name resource.k8s.io/v1 models.
        while not self._halt.is_set():
            try:
                resp = self.list_fn(
                    NS, watch=True, resource_version=self.rv, timeout_seconds=2,
                    _preload_content=False,
                )  # fmt: skip
                try:
                    for line in iter_resp_lines(resp):
                        self.take(json.loads(line))
                finally:
                    resp.release_conn()
            except Exception as err:  # expired resource version, dropped stream: from now
                self.error = repr(err)
                time.sleep(0.2)
                self.rv = self.list_fn(NS).metadata.resource_version

    def take(self, event: Obj) -> None:
        obj = event["object"]
        if event["type"] == "ERROR":
            raise RuntimeError(f"watch: {obj.get('message')}")
        self.rv = obj["metadata"]["resourceVersion"]
        k = self.key(obj)
        if k and k not in self.seen and self.ready(obj):
            self.seen[k] = time.monotonic()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def owner_pod(claim: Obj) -> str | None:
    owners = claim["metadata"].get("ownerReferences") or []
    return next((o["name"] for o in owners if o.get("kind") == "Pod"), None)


def timed_pods(
    core: client.CoreV1Api, res: client.ResourceV1Api, tag: str, devices: Obj, pods: int,
    until: str, cpu: Callable[[], float], timeout: float,
) -> tuple[dict[str, float], dict[str, float], float]:  # fmt: skip
    """Create template `tag` for `devices` and `pods` pods with a claim from it, at
    once; wait up to `timeout` s for each to be bound (`until` "bound") or its claim
    allocated. Creation and done times (monotonic) by pod name, and the `cpu`
    seconds used from the template's creation to the wait's end; the round's
    objects stay for the caller to read and :func:`clean`."""
    cpu_before = cpu()
    res.create_namespaced_resource_claim_template(
        NS, {"metadata": {"name": tag}, "spec": {"spec": {"devices": devices}}}
    )
    if until == "bound":
        stamps = Stamps(
            core.list_namespaced_pod,
            lambda p: str(p["metadata"]["name"]),
            lambda p: bool(p["spec"].get("nodeName")),
        )
    else:
        stamps = Stamps(
            res.list_namespaced_resource_claim,
            owner_pod,
            lambda c: bool((c.get("status") or {}).get("allocation")),
        )
    stamps.start()
    time.sleep(0.5)  # let the watch connect before the first pod
    created: dict[str, float] = {}
    for i in range(pods):
        name = f"{tag}-{i}"
        created[name] = time.monotonic()
        core.create_namespaced_pod(NS, {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "m", "image": "pause",
                                      "resources": {"claims": [{"name": "c"}]}}],
                     "resourceClaims": [{"name": "c", "resourceClaimTemplateName": tag}],
                     "terminationGracePeriodSeconds": 0},
        }, _preload_content=False)  # fmt: skip
    deadline = time.monotonic() + timeout
    while len(stamps.seen) < pods and time.monotonic() < deadline:
        time.sleep(0.1)
    cpu_used = cpu() - cpu_before
    stamps.stop()
    if len(stamps.seen) < pods and stamps.error:
        print(f"warning: watch failed: {stamps.error}", flush=True)
    done = {n: stamps.seen[n] for n in created if n in stamps.seen}
    return created, done, cpu_used


def clean(core: client.CoreV1Api, res: client.ResourceV1Api, template: str) -> None:
    """Delete the round's pods, claims and template and wait until they are gone."""
    core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    res.delete_collection_namespaced_resource_claim(NS)
    res.delete_namespaced_resource_claim_template(template, NS)
    start = time.monotonic()
    while time.monotonic() - start < 90:
        claims = res.list_namespaced_resource_claim(NS).items
        if not claims and not core.list_namespaced_pod(NS).items:
            return
        if time.monotonic() - start > 30:  # a finalizer nobody lifts: drop it
            for c in claims:
                if c.metadata.finalizers:
                    res.patch_namespaced_resource_claim(
                        c.metadata.name, NS, {"metadata": {"finalizers": None}}
                    )
        time.sleep(0.5)
    print(f"warning: round {template} left objects behind after 90 s", flush=True)
