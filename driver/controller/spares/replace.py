"""Replacements: a warm spare for a node that lost a GPU (issue 38).

Why: a GPU that failed for good leaves its node one GPU short until a
person acts, and the pods evicted from it (``NoExecute``) come back through
their own controllers looking for capacity. With ``spares_replace_failed``
on, the spare policy (``driver.controller.spares.policy``) wants one warm
spare more on such a node for each GPU it lost and has not been given back
yet: attached there in advance and published without binding conditions,
it is what the evicted pod's replacement takes at once, through any class
that serves fabric GPUs too (``gpu.patchbay.dev``, spare-first lists).

What counts as lost:

- a node-local GPU its plugin's ``patchbay.dev/health`` annotation shows
  unhealthy in a class the node does not cure itself (replace, reboot) or
  given up on (state ``failed``); a reset-class GPU under way to its reset
  comes back by itself and is not replaced;
- a fabric GPU that failed on that node (``driver.controller.health``),
  until its failure ends.

Given back: the fabric GPUs attached to the node for claims (the
replacement a pod took among them). Stateless: a restarted controller
counts the same, and a GPU back in service (reset, cleared) makes its
replacement no longer wanted (a spare no pod took is then released).
Replacements are spares: under the spares cap like the others, and never
released for being idle (they count as the node's floor). Pure functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from driver.controller.spares.policy import Free, Key, Spare
from driver.fabricclient.model import FabricInventory
from driver.health.history import NodeHealth

GIVEN_UP = "failed"  # the plugin's recovery gave up on the GPU
NOT_CURED_HERE = ("replace", "reboot")


def lost_local(node: Mapping[str, object], fabric_uuids: Collection[str]) -> int:
    """How many of the node's own GPUs its health annotation shows lost."""
    health = NodeHealth.from_node(node)
    if health is None:
        return 0
    return sum(
        1
        for uuid, g in health.gpus.items()
        if uuid not in fabric_uuids
        and g.state != "healthy"
        and (g.state == GIVEN_UP or g.failure_class in NOT_CURED_HERE)
    )


def lost_gpus(
    nodes: Mapping[str, Mapping[str, object]], inv: FabricInventory,
    failed_fabric: Mapping[str, Collection[str]],
) -> dict[str, list[str]]:  # fmt: skip
    """Node -> the models of the GPUs it lost ("" for a local one: its
    model is the node's to say); ``failed_fabric``: node -> the fabric
    devices that failed there."""
    models = {d.id: d.model for d in inv.devices}
    uuids = {d.uuid for d in inv.devices if d.uuid}
    out: dict[str, list[str]] = {}
    for name, node in nodes.items():
        lost = [""] * lost_local(node, uuids)
        lost += [models.get(i, "") for i in sorted(failed_fabric.get(name, ()))]
        if lost:
            out[name] = lost
    return out


def replacements(
    lost: Mapping[str, list[str]], inv: FabricInventory, needed: Collection[str],
    failed: Collection[str], spares: Iterable[Spare], free: Iterable[Free],
) -> dict[Key, int]:  # fmt: skip
    """(node, "gpu", model) -> the spares wanted there to replace what the
    node lost, less the healthy fabric GPUs attached to it for claims.

    The model: that of a GPU spare the node has (the replacement already
    there), else of a lost fabric GPU that a free one of the same model can
    replace, else of the first free GPU that reaches the node. A node that
    nothing free reaches gets none."""
    spares, free = list(spares), list(free)
    given: dict[str, int] = {}
    for d in inv.devices:
        conn = d.connection
        if d.kind == "gpu" and conn is not None and d.id in needed and d.id not in failed:
            given[conn.node] = given.get(conn.node, 0) + 1
    out: dict[Key, int] = {}
    for node, models in sorted(lost.items()):
        short = len(models) - given.get(node, 0)
        if short <= 0:
            continue
        here = sorted((f.model, f.device_id) for f in free
                      if f.kind == "gpu" and any(n == node for n, _ in f.places))  # fmt: skip
        mine = sorted(s.model for s in spares if s.kind == "gpu" and s.node == node)
        same = [m for m in models if m and any(m == fm for fm, _ in here)]
        model = (mine or same or [fm for fm, _ in here] or [""])[0]
        if model:
            out[(node, "gpu", model)] = short
    return out
