"""Device metadata files (KEP-5304) in real containers (kubelet + containerd).

A container reads the file of each of its claim's requests at the upstream
path (``/var/run/kubernetes.io/dra-device-attributes/...``) and finds there
the devices it was allocated, with the attributes their ResourceSlice
publishes (``pciBusID`` above all: KubeVirt's ``GPUsWithDRA`` reads it):
a GPU, a MIG device and a VF from a claim template (the
``resourceclaimtemplates/<podClaimName>`` path), a GPU bound to vfio-pci
from a plain claim (the ``resourceclaims/<claim>`` path).
"""

from __future__ import annotations

from typing import Any

import pytest

from driver.claims.metadata import CONTAINER_DIR, read_stream
from tests.node.helpers import Tier, attr, on_node

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

BUS = "resource.kubernetes.io/pciBusID"
FILE = "patchbay.dev-metadata.json"
# Prints each metadata file on one line: "META <path> <content, newlines dropped>".
PRINT = (
    f"find {CONTAINER_DIR} -name '*.json' | sort | "
    "while read f; do echo \"META $f $(tr -d '\\n' < $f)\"; done; "
    "trap 'exit 0' TERM; while :; do sleep 1; done"
)


def request(name: str, device_class: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class}}


def pod(name: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.35",
                    "command": ["sh", "-c", PRINT],
                    "resources": {"claims": [{"name": "devs"}]},
                }
            ],
            "resourceClaims": [{"name": "devs", **claim}],
        },
    }


def files_seen(tier: Tier, ns: str, name: str) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for line in tier.logs(ns, name):
        if line.startswith("META "):
            _, path, content = line.split(" ", 2)
            out[path] = read_stream(content.encode())
    return out


Published = dict[tuple[str, str], dict[str, Any]]


def check(
    tier: Tier, published: Published, ns: str, name: str, claim: dict[str, Any], where: str
) -> None:
    """Each allocated device is in its request's file, with the attributes it
    was published with (a GPU in passthrough is withdrawn while it is held)."""
    files = files_seen(tier, ns, name)
    results = claim["status"]["allocation"]["devices"]["results"]
    expected = {
        f"{CONTAINER_DIR}/{where}/{r['request']}/patchbay.dev-metadata.json" for r in results
    }
    assert set(files) == expected, (sorted(files), sorted(expected))
    for r in results:
        path = f"{CONTAINER_DIR}/{where}/{r['request']}/patchbay.dev-metadata.json"
        newest = files[path][0]
        assert newest["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
        assert newest["metadata"]["uid"] == claim["metadata"]["uid"]
        (device,) = newest["requests"][0]["devices"]
        assert (device["pool"], device["name"]) == (r["pool"], r["device"])
        slice_device = published[(r["pool"], r["device"])]
        if "-mig-" in r["device"]:
            # A MIG placement publishes no pciBusID since the lean slices
            # (issue 26), so its file carries none either.
            assert BUS not in slice_device["attributes"], slice_device
            assert BUS not in device["attributes"], device
        else:  # a whole PCI device (GPU, VF, vfio GPU): KubeVirt reads this
            assert device["attributes"][BUS]["string"] == attr(slice_device, BUS)
        assert device["attributes"]["type"] == slice_device["attributes"]["type"]


def test_containers_read_their_devices_metadata(tier: Tier, namespace: str) -> None:
    ns = namespace
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "meta-devs"},
        "spec": {"spec": {"devices": {"requests": [
            request("gpu", "gpu.patchbay.dev"),
            request("mig", "mig.patchbay.dev"),
            request("nic", "vf.patchbay.dev"),
        ]}}},
    }  # fmt: skip
    vfio = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "meta-vfio"},
        "spec": {"devices": {"requests": [request("vm-gpu", "vfio-gpu.patchbay.dev")]}},
    }
    docs = [
        template,
        vfio,
        pod("meta-job", {"resourceClaimTemplateName": "meta-devs"}),
        pod("meta-vfio-job", {"resourceClaimName": "meta-vfio"}),
    ]
    published = tier.devices_by_name()
    tier.apply(ns, on_node(docs, "node-a"))
    tier.running(ns, "meta-job")
    claim = tier.claim_of(ns, "meta-job")
    check(tier, published, ns, "meta-job", claim, "resourceclaimtemplates/devs")
    tier.running(ns, "meta-vfio-job")
    claim = tier.get("resourceclaim", "meta-vfio", "-n", ns)
    check(tier, published, ns, "meta-vfio-job", claim, "resourceclaims/meta-vfio")
    for name in ("meta-job", "meta-vfio-job"):
        tier.delete_pod(ns, name)
