"""Names and node annotations shared by the controller and the node plugin.

Why: the controller publishes one fabric pool variant per (GPU, node,
adapter); the node plugin must map an allocated variant back to the GPU that
appeared under that adapter. Deriving the variant name from facts both sides
know (the GPU's NVML UUID, which the fabric reports and NVML shows once the
GPU is attached, plus node and adapter) lets the plugin compute the same
name without reading the fabric pool. The plugin tells the controller what
it sees through one Node annotation (adapter roots and attached GPU UUIDs).
Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FABRIC_POOL = "fabric"
NODE_ANNOTATION = "patchbay.dev/fabric"
READY_CONDITION = "FabricDeviceReady"
FAILED_CONDITION = "FabricAttachFailed"

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _short(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def variant_name(uuid: str, node: str, adapter: str) -> str:
    """The fabric pool device name of GPU ``uuid`` reached via ``node``/``adapter``.

    A DNS label of at most 63 characters, unique per (uuid, node, adapter):
    ``fgpu-<8 hex of the UUID's hash>-<node>-<adapter>``, or with the
    node/adapter part hashed when that would be too long or not a label.
    """
    head = f"fgpu-{_short(uuid, 8)}"
    tail = f"{node}-{adapter}".lower()
    name = f"{head}-{tail}"
    if len(name) <= 63 and _LABEL.match(name):
        return name
    return f"{head}-{_short(f'{node}/{adapter}', 16)}"


def counter_name(device_id: str) -> str:
    """A DNS-label counter name for a fabric device id."""
    name = device_id.lower()
    if len(name) <= 63 and _LABEL.match(name):
        return name
    return f"d-{_short(device_id, 16)}"


@dataclass(frozen=True)
class NodeFabric:
    """What a node plugin reports about its fabric adapters (Node annotation)."""

    adapters: Mapping[str, str] = field(default_factory=dict)  # adapter -> pcieRoot
    gpus: Mapping[str, str] = field(default_factory=dict)  # attached GPU UUID -> adapter

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "adapters": dict(sorted(self.adapters.items())),
                "gpus": dict(sorted(self.gpus.items())),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeFabric | None:
        """The node's report, or None without (or with a malformed) annotation."""
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            adapters = {str(k): str(v) for k, v in (data.get("adapters") or {}).items()}
            gpus = {str(k): str(v) for k, v in (data.get("gpus") or {}).items()}
        except (ValueError, AttributeError):
            return None
        return cls(adapters, gpus)
