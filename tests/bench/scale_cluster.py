"""The scale bench's hollow nodes and what it reads off the control plane.

Why: at hundreds or thousands of nodes the bench cannot afford a kubelet
per node, nor ``sched_world``'s heartbeat (a Lease and a Node status patch
per node every 10 s: 1000 writes/s at 5000 nodes, more than the 2-core
machine serves). Hollow nodes here are Node objects with a Ready status and
a Lease, renewed by one thread as a kubelet renews them (Lease every 10 s,
Node status every 5 min, the kubelet's defaults) but never faster than a
bounded write rate (``--max-beat-writes``): past that the renewal period
stretches, and the bench prints the period it reached. The control plane's
node lifecycle controller does not mark such nodes NotReady (the local
cluster's grace period is an hour), so the stretch costs nothing but the
fidelity of the write load, which the bench states.

Readings: resident memory of the apiserver and etcd (``/proc``), etcd's DB
size (its ``/metrics``, at the address the apiserver was given), watch
counts (the apiserver's ``apiserver_longrunning_requests``), and each node's
slices as the API serves them (compact JSON, managed fields included).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.bench.sched_world import make_leased_node, renew

Obj = dict[str, Any]
LEASE_EVERY = 10.0  # kubelet: nodeLeaseDurationSeconds 40 / 4
STATUS_EVERY = 300.0  # kubelet: nodeStatusReportFrequency


class LeaseBeat(threading.Thread):
    """Renews every hollow node's Lease (and, less often, its Ready status)."""

    def __init__(self, api: client.ApiClient, nodes: list[str], max_writes: float) -> None:
        super().__init__(name="lease-beat", daemon=True)
        self.core, self.coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.nodes, self.max_writes = nodes, max_writes
        self.errors = 0
        self.periods: list[float] = []  # seconds one pass over every Lease took
        self._halt = threading.Event()

    def run(self) -> None:
        last_status = time.monotonic()
        while not self._halt.is_set():
            start = time.monotonic()
            gap = max(LEASE_EVERY / max(len(self.nodes), 1), 1.0 / self.max_writes)
            status = start - last_status >= STATUS_EVERY
            for i, node in enumerate(self.nodes):
                if self._halt.wait(max(0.0, start + i * gap - time.monotonic())):
                    return
                self._renew(node, status)
            if status:
                last_status = start
            self.periods.append(time.monotonic() - start)
            self._halt.wait(max(0.0, start + LEASE_EVERY - time.monotonic()))

    def _renew(self, node: str, status: bool) -> None:
        try:
            renew(self.core, self.coord, node, status)
        except ApiException:
            self.errors += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def make_hollow_nodes(
    api: client.ApiClient, names: list[str], labels: Mapping[str, str] | None = None
) -> list[Obj]:
    """Create the nodes (with ``labels`` too) and their Leases; the Node objects
    as JSON (name, uid for owner references, labels for node selection)."""
    core, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
    nodes = []
    for name in names:
        make_leased_node(core, coord, name, labels)
        node = core.read_node(name)
        meta = {"name": name, "uid": node.metadata.uid, "labels": node.metadata.labels or {}}
        nodes.append({"metadata": meta})
    return nodes


def untainted(core: client.CoreV1Api) -> int:
    return sum(not n.spec.taints for n in core.list_node().items)


# -- readings ------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def metrics_text(api: client.ApiClient, path: str = "/metrics") -> str:
    resp = api.call_api(*api.param_serialize("GET", path, auth_settings=["BearerToken"]))
    body = resp.read()
    if not 200 <= resp.status <= 299:
        raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
    return bytes(body).decode()


def samples(text: str, metric: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample of ``metric`` in a Prometheus text body."""
    out = []
    for line in text.splitlines():
        if line.startswith(metric + "{") or line.startswith(metric + " "):
            head, _, value = line.rpartition(" ")
            out.append((head[len(metric) :], float(value)))
    return out


def watches(api: client.ApiClient) -> tuple[int, int]:
    """Open watches at the apiserver: all, and those on resourceslices."""
    rows = samples(metrics_text(api), "apiserver_longrunning_requests")
    watch = [(labels, v) for labels, v in rows if 'verb="WATCH"' in labels]
    on_slices = sum(v for labels, v in watch if 'resource="resourceslices"' in labels)
    return int(sum(v for _, v in watch)), int(on_slices)


def etcd_url(apiserver_pid: int) -> str:
    argv = Path(f"/proc/{apiserver_pid}/cmdline").read_bytes().split(b"\0")
    for arg in argv:
        if arg.startswith(b"--etcd-servers="):
            return arg.split(b"=", 1)[1].decode().split(",")[0]
    raise RuntimeError("the apiserver was started without --etcd-servers")


def etcd_db_mb(url: str) -> tuple[float, float]:
    """etcd's DB file size and the part of it in use, MB."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = sum(v for _, v in samples(text, "etcd_mvcc_db_total_size_in_bytes"))
    in_use = sum(v for _, v in samples(text, "etcd_mvcc_db_total_size_in_use_in_bytes"))
    return total / 1e6, in_use / 1e6


def served_slices(res: client.ResourceV1Api, node: str | None = None) -> list[Obj]:
    """ResourceSlices (of one node, or all) as the API serves them, as JSON."""
    kwargs: dict[str, Any] = {"_preload_content": False}
    if node is not None:
        kwargs["field_selector"] = f"spec.nodeName={node}"
    resp = res.list_resource_slice(**kwargs)
    items: list[Obj] = json.loads(resp.data)["items"]
    return items


def json_bytes(obj: Obj) -> int:
    """Bytes of ``obj`` as compact JSON (what a GET of it serves)."""
    return len(json.dumps(obj, separators=(",", ":")).encode())
