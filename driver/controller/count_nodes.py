"""Each Node's machine id for a count-based fabric manager, from the Nodes themselves.

Why a module: the ``count`` dialect asks the manager for devices on a
*machine* (its ``mach_uuid``), and how a Node maps to one is a setting:
``fabric_machines`` lists them, or ``fabric_machine_key`` names a Node
label or annotation that holds it (written by whoever provisions the
machines, as CoHDI reads its machine id off the Node or its BareMetalHost).
The controller already watches the Nodes; on each pass this hands their
labels and annotations to the dialect, so a Node labelled later is served
from the next pass on. Any other dialect (or the in-memory fabric of the
tests) is left alone. :func:`counts_models` tells the reconciler which pool
such a fabric gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from driver.fabricclient.dialect_count import CountDialect


def node_metadata(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Node name -> its labels and annotations (an annotation wins a clash)."""
    out: dict[str, dict[str, str]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta.get("name")
        if name:
            out[str(name)] = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return out


def counts_models(fabric: object) -> bool:
    """Whether ``fabric`` speaks the count dialect: its pool offers model slots
    (``driver.controller.count_pool``), not devices."""
    return isinstance(getattr(fabric, "dialect", None), CountDialect)


def learn_machines(fabric: object, nodes: Iterable[Mapping[str, Any]]) -> None:
    """Give a count dialect the Nodes' machine ids (their ``fabric_machine_key``)."""
    dialect = getattr(fabric, "dialect", None)
    if isinstance(dialect, CountDialect) and dialect.machines.key:
        dialect.machines.set_nodes(node_metadata(nodes))
