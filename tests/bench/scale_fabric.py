"""The scale bench's fabric pool, in either shape, published and withdrawn between bursts.

Why: issue 34 asks what the fabric pool costs every DRA pod, "with" against
"without", from the same run on the same nodes, for the per-domain shape
(each device once, ``driver.controller.pool.domain_pool``) against the
per-node one it replaces (a variant per device and node,
``driver.controller.pool.devices``). Both are built here by the
controller's own builders over one simulated inventory
(``sched_world.fabric_world``: every fabric GPU on one switch, reachable
from every hollow node through its adapter0), and in the per-domain shape
the hollow nodes carry the domain's reach label as provisioning would set it
(:func:`reach_labels`), so the domain pool's ``nodeSelector`` selects them
all; its adapter pools (one per node, ``fabric/adapters/<node>``) come with
it, as the controller publishes them. :class:`FabricSlices` moves the
cluster from one fabric (or none) to another: a pool whose slices are
unchanged stays (the adapter pools between two fabric sizes), a changed one
is replaced at a new generation, and it reports the fabric's slices and
bytes as the apiserver served them back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from driver.controller.pool.domain_pool import build_domain_pools
from driver.controller.pool.domains import reach_domains
from driver.fabric_devices.naming import ADAPTERS
from driver.slices.build import PoolSpec, build_slices, slice_object
from tests.bench.sched_world import FABRIC_POOL, fabric_spec, fabric_world

SHAPES = ("per-domain", "per-node")
LABEL_KEY = "bench.patchbay.dev/fabric"  # on every fabric slice: one delete withdraws them
WRITERS = 4  # parallel creates: the adapter pools are a slice per node
Obj = dict[str, Any]


def reach_labels(shape: str) -> dict[str, str]:
    """The labels provisioning gives a node cabled to the bench's fabric:
    its reach domain's, in the per-domain shape (none in the per-node one)."""
    if shape != "per-domain":
        return {}
    inventory, _ = fabric_world(1, ["x"])
    return {d.label: "" for d in reach_domains(inventory)}


def fabric_pools(shape: str, gpus: int, nodes: list[Obj]) -> list[PoolSpec]:
    """The fabric's pools as the controller builds them for ``nodes`` (Node
    objects as JSON, with their labels), each slice labelled for withdrawal."""
    names = [str(n["metadata"]["name"]) for n in nodes]
    if shape == "per-node":
        specs = [fabric_spec(gpus, names, "node-major")]
    else:
        inventory, reports = fabric_world(gpus, names)
        built = build_domain_pools(FABRIC_POOL, inventory, reports, nodes, (), {}, {})
        specs = [*built.pools, *built.adapters]
    return [dataclasses.replace(s, labels={LABEL_KEY: "true"}) for s in specs]


def is_adapter_pool(pool: str) -> bool:
    return pool.startswith(f"{FABRIC_POOL}/{ADAPTERS}/")


@dataclass
class Published:
    """One pool as stored: its slice bodies as built (generation aside) and the
    bytes the apiserver served back for them (compact JSON, managed fields)."""

    key: str
    names: list[str]
    served_bytes: int
    devices: int


def _key(bodies: Iterable[Obj]) -> str:
    """What a pool's slices say, its generation aside: equal keys, same pool."""
    out = []
    for b in bodies:
        spec = dict(b["spec"])
        spec["pool"] = {**spec["pool"], "generation": 0}
        out.append({"name": b["metadata"]["name"], "spec": spec})
    return json.dumps(out, sort_keys=True)


class FabricSlices:
    """The fabric's pools in the cluster; :meth:`show` moves them to a new set."""

    def __init__(self, res: client.ResourceV1Api) -> None:
        self.res = res
        self.pools: dict[str, Published] = {}
        self.generation = 0

    def _create(self, body: Obj) -> int:
        resp = self.res.create_resource_slice(body, _preload_content=False)
        return len(json.dumps(json.loads(resp.data), separators=(",", ":")).encode())

    def _delete(self, name: str) -> None:
        self.res.delete_resource_slice(name, _preload_content=False)

    def show(self, specs: list[PoolSpec]) -> None:
        """Publish ``specs`` (none: withdraw every fabric slice); pools already
        stored as built stay."""
        self.generation += 1
        wanted: dict[str, tuple[PoolSpec, list[Obj]]] = {}
        for spec in specs:
            desired = build_slices(spec)
            bodies = [slice_object(spec, d, self.generation, len(desired)) for d in desired]
            wanted[spec.pool_name] = (spec, bodies)
        gone = [p for p in self.pools if p not in wanted or self.pools[p].key != _key(wanted[p][1])]
        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(self._delete, [n for p in gone for n in self.pools.pop(p).names]))
            for name, (spec, bodies) in wanted.items():
                if name in self.pools:
                    continue
                sizes = list(pool.map(self._create, bodies))
                names = [b["metadata"]["name"] for b in bodies]
                self.pools[name] = Published(_key(bodies), names, sum(sizes), len(spec.devices))

    def withdraw(self) -> None:
        self.show([])

    def summary(self) -> str:
        """The fabric pool (the devices' pools) and the adapter pools: slices, devices, bytes."""
        parts = []
        for what, adapters in (("fabric pool", False), ("adapter pools", True)):
            mine = [p for n, p in self.pools.items() if is_adapter_pool(n) == adapters]
            if not mine and adapters:
                continue
            slices = sum(len(p.names) for p in mine)
            devices = sum(p.devices for p in mine)
            size = sum(p.served_bytes for p in mine)
            parts.append(
                f"{what}: {len(mine)} pools, {slices} slices, {devices} devices, "
                f"{size / 1e3:.1f} kB as served"
            )
        return "; ".join(parts)

    def sizes(self) -> tuple[int, int]:
        """Slices and served bytes of the fabric pool proper (adapter pools aside)."""
        mine = [p for n, p in self.pools.items() if not is_adapter_pool(n)]
        return sum(len(p.names) for p in mine), sum(p.served_bytes for p in mine)
