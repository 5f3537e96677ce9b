"""What the burst left on the nodes, checked against the claims' allocations.

Why this module exists: after a burst, "never a device in two claims" and
"nothing left after the pods are gone" are facts about the nodes' files and
simulated hardware, not about pod phases: every prepared CDI spec in each
node's CDI directory and every record in each plugin's checkpoint must match
the claims' ``status.allocation`` one to one, and once the pods are deleted
no spec, record, MIG instance or vfio binding may remain. Each function
returns the problems it found (empty: none), so a test can show them all.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from kubernetes import client

from driver.cdi import FILE_PREFIX, VENDOR
from driver.claims.metadata_files import CDI_DEVICE_PREFIX as METADATA_DEVICE_PREFIX
from tests.checkpoint_view import recorded
from tests.e2e.burst import BurstNodes
from tests.harness.simnode import SimNode

Key = tuple[str, str, str]  # (claim uid, pool, device)


def _node_of(alloc: Any) -> str:
    """The node an allocation is for (its node selector's metadata.name)."""
    for term in alloc.node_selector.node_selector_terms if alloc.node_selector else []:
        for field in term.match_fields or []:
            if field.key == "metadata.name" and field.values:
                return str(field.values[0])
    return ""


def allocations(resource_api: client.ResourceV1Api, ns: str) -> dict[Key, str]:
    """(claim uid, pool, device) of every device of ours allocated to a claim
    in ``ns``, with the node the allocation is for."""
    out: dict[Key, str] = {}
    for claim in resource_api.list_namespaced_resource_claim(ns).items:
        alloc = claim.status.allocation if claim.status else None
        for r in alloc.devices.results if alloc else []:
            if r.driver == "patchbay.dev":
                out[(claim.metadata.uid, r.pool, r.device)] = _node_of(alloc)
    return out


def cdi_devices(node: SimNode) -> list[tuple[str, str]]:
    """(claim uid, device) of every device in the node's CDI specs of ours."""
    out: list[tuple[str, str]] = []
    for path in sorted(node.agent.cdi_root.glob(f"{FILE_PREFIX}*.json")):
        uid = path.name[len(FILE_PREFIX) : -len(".json")]
        spec = json.loads(path.read_text())
        for dev in spec.get("devices") or []:
            name = str(dev["name"])
            assert name.startswith(uid + "-"), f"{path}: device {name} of another claim"
            if name[len(uid) + 1 :].startswith(METADATA_DEVICE_PREFIX):
                continue  # a request's metadata mount (KEP-5304), not an allocated device
            out.append((uid, name[len(uid) + 1 :]))
    return out


def checkpoint(node: SimNode) -> dict[str, Any]:
    path = node.plugin.plugin_dir / "checkpoint.json"
    claims: dict[str, Any] = recorded(path).get("claims") or {}
    return claims


def checkpoint_devices(node: SimNode) -> list[Key]:
    return [
        (uid, d["pool_name"], d["device_name"])
        for uid, record in checkpoint(node).items()
        for d in record.get("devices") or []
    ]


def _one_to_one(what: str, found: list[Any], expected: set[Any]) -> list[str]:
    problems = [f"{what}: {k} appears {n} times" for k, n in Counter(found).items() if n > 1]
    problems += [f"{what}: {k} is not allocated to that claim" for k in set(found) - expected]
    problems += [f"{what}: allocated {k} is missing" for k in expected - set(found)]
    devices = Counter(k[1:] for k in set(found))
    problems += [f"{what}: device {d} is in {n} claims" for d, n in devices.items() if n > 1]
    return problems


def audit(resource_api: client.ResourceV1Api, ns: str, nodes: BurstNodes) -> list[str]:
    """Problems in the one-to-one match of allocations, CDI specs and
    checkpoint records, node by node (the claims must all be prepared)."""
    allocated = allocations(resource_api, ns)
    per_device = Counter((pool, dev) for _, pool, dev in allocated)
    problems = [f"allocation: {d} is in {n} claims" for d, n in per_device.items() if n > 1]
    for node in nodes:
        mine = {k for k, on in allocated.items() if on == node.name}
        cdi = {(uid, dev) for uid, _, dev in mine}
        problems += _one_to_one(f"{node.name} CDI", cdi_devices(node), cdi)
        problems += _one_to_one(f"{node.name} checkpoint", checkpoint_devices(node), mine)
        states = {r.get("state") for r in checkpoint(node).values()}
        if states - {"PrepareCompleted"}:
            problems.append(f"{node.name} checkpoint: states {sorted(states)}")
    return problems


def mig_instances(node: SimNode) -> list[str]:
    """The MIG GPU instances the node's NVML mock holds, as words."""
    return [
        f"{gpu['pci_bus_id']} GI profile {gi['profile_id']} at {gi['start']}"
        for gpu in node.host.nvml.read()["gpus"]
        for gi in gpu.get("gpu_instances") or []
    ]


def vfio_bound(node: SimNode) -> list[str]:
    """PCI functions of the node's simulated sysfs bound to vfio-pci."""
    tree = node.host.tree
    return sorted(
        p.name for p in tree.bus_devices.iterdir() if tree.driver_of(p.name) == "vfio-pci"
    )


def leftovers(nodes: BurstNodes) -> list[str]:
    """What the deleted pods left on the nodes (empty: nothing)."""
    problems: list[str] = []
    for node in nodes:
        specs = sorted(p.name for p in node.agent.cdi_root.glob(f"{VENDOR}-*.json"))
        problems += [f"{node.name}: CDI spec {s} left" for s in specs]
        problems += [f"{node.name}: checkpoint record {u} left" for u in checkpoint(node)]
        problems += [f"{node.name}: MIG instance {m} left" for m in mig_instances(node)]
        problems += [f"{node.name}: {bdf} left bound to vfio-pci" for bdf in vfio_bound(node)]
    return problems
