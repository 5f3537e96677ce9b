"""What the real-node tests do through kubectl, helm and the nodes' own files.

Why this module exists: the tests talk to the cluster as a user would (the
pinned kubectl and helm binaries), read what a container printed with
``kubectl logs``, and look at a node's CDI directory and plugin checkpoint
through the host paths of its private mounts; one place for all of that keeps
each test about its behaviour.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.checkpoint_view import recorded
from tests.e2e.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deviceclasses" / "examples"
RELEASE_NS = "patchbay"
UUID = "patchbay.dev/uuid"  # the device attribute naming a GPU
PLUGIN_LABELS = "app.kubernetes.io/component=plugin"
# The tier's idle window, seconds (the chart's kubeletPlugin.idleWindow, conftest.py).
IDLE_WINDOW_S = 8


class Node:
    """A real node as the tests see it from the host."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.name: str = real.name

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """The CDI spec files in the node's /var/run/cdi, by file name."""
        out = {}
        for p in sorted(self.real.cdi_dir.glob("*.json")):
            out[p.name] = json.loads(p.read_text())
        return out

    def claim_specs(self) -> list[str]:
        return [n for n in self.cdi_specs() if n.startswith("k8s.patchbay.dev-claim")]

    def checkpoint_claims(self) -> dict[str, Any]:
        path = self.real.host_path("/var/lib/kubelet/plugins/patchbay.dev/checkpoint.json")
        data = recorded(path)
        return dict(data.get("claims", {}))


@dataclass
class Tier:
    cluster: Any
    nodes: dict[str, Node]
    release: Any  # realnode_chart.Release

    # -- figures (printed at the end of the run, never asserted) -----------------

    def record(self, name: str, value: str) -> None:
        path = self.cluster.run_dir / "figures.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = value
        path.write_text(json.dumps(data, indent=1) + "\n")

    # -- clients ----------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        proc = self.cluster.kubectl(*args, check=False, stdin=stdin)
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)}: {proc.stderr.strip()}", pytrace=False)
        return str(proc.stdout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    # -- objects ----------------------------------------------------------------

    def new_namespace(self) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        wait_for("default ServiceAccount", lambda: self.kubectl(
            "get", "sa", "default", "-n", name, check=False), timeout=30)  # fmt: skip
        return name

    def apply(self, ns: str, docs: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump_all(docs))

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.get("pod", name, "-n", ns))

    def running(self, ns: str, name: str, timeout: float = 120.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            pod = self.pod(ns, name)
            if pod["status"].get("phase") == "Running" and all(
                c.get("ready") for c in pod["status"].get("containerStatuses", [])
            ):
                return pod
            return None

        try:
            return dict(wait_for(f"pod {ns}/{name} Running", probe, timeout))
        except BaseException:
            print(self.kubectl("describe", "pod", name, "-n", ns, check=False))
            raise

    def logs(self, ns: str, name: str) -> list[str]:
        return self.kubectl("logs", name, "-n", ns).splitlines()

    def events(self, ns: str, name: str) -> list[dict[str, Any]]:
        items = self.get("events", "-n", ns, "--field-selector",
                         f"involvedObject.name={name}")["items"]  # fmt: skip
        return list(items)

    def delete_pod(self, ns: str, name: str, timeout: float = 90.0) -> None:
        self.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
        wait_for(f"pod {ns}/{name} gone", lambda: not self.kubectl(
            "get", "pod", name, "-n", ns, "--ignore-not-found", "-o", "name"), timeout)  # fmt: skip

    def plugin_pods(self) -> list[dict[str, Any]]:
        return list(self.get("pods", "-n", RELEASE_NS, "-l", PLUGIN_LABELS)["items"])

    def plugin_pod_on(self, node: str) -> dict[str, Any]:
        pods = [p for p in self.plugin_pods() if p["spec"].get("nodeName") == node
                and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def claim_of(self, ns: str, pod: str) -> dict[str, Any]:
        statuses = self.pod(ns, pod)["status"].get("resourceClaimStatuses", [])
        assert statuses, f"{pod} has no generated claim"
        return dict(self.get("resourceclaim", statuses[0]["resourceClaimName"], "-n", ns))

    def devices_by_name(self) -> dict[tuple[str, str], dict[str, Any]]:
        out = {}
        for s in self.get("resourceslices")["items"]:
            for d in s["spec"].get("devices", []):
                out[(s["spec"]["pool"]["name"], d["name"])] = d
        return out


def example(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def seen(lines: list[str]) -> tuple[dict[str, str], set[str]]:
    """What an example container printed: its env (NAME=value) and device nodes."""
    env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("/"))
    nodes = {line for line in lines if line.startswith("/dev/")}
    return env, nodes


def attr(device: dict[str, Any], name: str) -> Any:
    """An attribute's value; our own (patchbay.dev/...) are stored without the domain."""
    attrs = device["attributes"]
    value = attrs.get(name) or attrs[name.removeprefix("patchbay.dev/")]
    return next(iter(value.values()))


def allocated(tier: Tier, ns: str, pod: str) -> list[tuple[str, dict[str, Any]]]:
    """(request, published device) of each device allocated to the pod's claim."""
    claim = tier.claim_of(ns, pod)
    devices = tier.devices_by_name()
    return [
        (r["request"], devices[(r["pool"], r["device"])])
        for r in claim["status"]["allocation"]["devices"]["results"]
    ]


def on_node(docs: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """The example's documents with its pods pinned to ``node`` (local devices)."""
    for d in docs:
        if d["kind"] == "Pod":
            d["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return docs
