"""Names and node annotations shared by the controller and the node plugin.

Why: the controller publishes one fabric pool variant per (device, node,
adapter); the node plugin must map an allocated variant back to the device
that appeared under that adapter. Deriving the variant name from facts both
sides know (a GPU's NVML UUID or a NIC's permanent MAC address, which the
fabric reports and the node sees once the device is attached, plus node and
adapter) lets the plugin compute the same name without reading the fabric
pool. The plugin tells the controller what it sees through one Node
annotation (adapter roots, attached GPU UUIDs and their board serials, NIC
MACs, NVMe serials and CXL memdevs (:func:`cxl_key`), and which of them a
claim holds prepared, so the controller detaches only what the node has
unprepared). Identities are
compared in one canonical form per kind (:func:`identity`), whatever form
the fabric or sysfs wrote them in. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.cxl import KIND as CXL_MEMORY
from driver.cxl.serial import cxl_identity
from driver.nvme import KIND as NVME

FABRIC_POOL = "fabric"  # the default of the fabric_pool setting (driver.fabric_devices.settings)
NODE_ANNOTATION = "patchbay.dev/fabric"
READY_CONDITION = "FabricDeviceReady"
# CoHDI's name for a binding that failed for good (docs/fabric.md, "CoHDI's
# condition names"); controllers before it published and wrote the legacy name,
# which allocations made then still list (read and written for them on upgrade).
FAILED_CONDITION = "FabricDeviceFailed"
LEGACY_FAILED_CONDITION = "FabricAttachFailed"
# The attribute of a fabric variant that says it is a warm spare attached
# there (true: published without binding conditions; docs/fabric.md).
SPARE_ATTRIBUTE = "spare"
# The key of a claim's device status data that names the node's own variant
# of the device a count-based manager attached for an allocated slot: the
# plugin prepares the allocated name as that device (docs/fabric.md).
PREPARED_AS_KEY = "preparedAs"
# Per-domain shape (docs/fabric.md, "Pool shapes and reach labels"): the
# Node label prefix of a reach domain (``<prefix><domain>``, set by
# provisioning) and the pools of ready warm spares, ``<fabric pool>/spares/<node>``.
REACH_LABEL_PREFIX = "reach.fabric.patchbay.dev/"
SPARE_POOLS = "spares"

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _short(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


PREFIX = {"gpu": "fgpu", "nic": "fnic", NVME: "fnvme", CXL_MEMORY: "fcxl"}
# Fabric kind -> the type its pool variants are published as (a NIC as a VF),
# and the attribute of a variant that carries the identity a node reports.
PUBLISHED_TYPE = {"gpu": "gpu", "nic": "vf", NVME: NVME, CXL_MEMORY: CXL_MEMORY}
FABRIC_KIND = {published: kind for kind, published in PUBLISHED_TYPE.items()}
IDENTITY_ATTRIBUTE = {"gpu": "uuid", "nic": "macAddress", NVME: "serial", CXL_MEMORY: "serial"}


def identity(kind: str, raw: str) -> str:
    """The canonical identity of a fabric device of ``kind`` (what variant names
    and the Node annotation use): GPU UUID as is, NIC MAC in lower case, NVMe
    serial without the padding spaces the 20-byte field carries, CXL serial
    as :func:`cxl_identity`."""
    if kind == CXL_MEMORY:
        return cxl_identity(raw)
    if kind == "nic":
        return raw.strip().lower()
    return raw.strip()


# A node's key of fabric CXL memory: ``<serial>@<memdev BDF>``. The LDs of one
# multi-logical device share the serial; on a host each is its own PCI function
# (docs/fabric.md, "Logical devices"). A key without ``@`` is an older plugin's.
CXL_KEY_SEP = "@"


def cxl_key(serial: str, bdf: str) -> str:
    """The node's key of the CXL memdev at ``bdf`` (``0x4c1d...@0000:87:00.0``)."""
    return f"{cxl_identity(serial)}{CXL_KEY_SEP}{bdf.strip().lower()}"


def cxl_serial_of(key: str) -> str:
    """The serial part of a node's CXL key (an older plugin's key is the serial)."""
    return key.partition(CXL_KEY_SEP)[0]


def cxl_bdf_of(key: str) -> str:
    """The memdev's BDF in a node's CXL key ("" for an older plugin's serial key)."""
    return key.partition(CXL_KEY_SEP)[2]


def variant_name(identity: str, node: str, adapter: str, kind: str = "gpu") -> str:
    """The fabric pool device name of a device reached via ``node``/``adapter``.

    ``identity`` is a GPU's NVML UUID, a NIC's MAC address, an NVMe serial or
    a CXL serial (canonical: :func:`identity`). A DNS label of at most 63
    characters, unique per (identity, node, adapter):
    ``fgpu-<8 hex of the identity's hash>-<node>-<adapter>`` (``fnic-``,
    ``fnvme-``, ``fcxl-`` for the other kinds), or with the node/adapter
    part hashed when that would be too long or not a label.
    """
    head = f"{PREFIX[kind]}-{_short(identity, 8)}"
    tail = f"{node}-{adapter}".lower()
    name = f"{head}-{tail}"
    if len(name) <= 63 and _LABEL.match(name):
        return name
    return f"{head}-{_short(f'{node}/{adapter}', 16)}"


def device_name(identity: str, kind: str = "gpu") -> str:
    """The name of a fabric device in a per-domain pool, where it is published
    once (``driver.controller.pool.domain_pool``): ``fgpu-<16 hex of the
    identity's hash>`` (``fnic-``, ``fnvme-``, ``fcxl-`` for the other kinds).
    The node prepares it as its own :func:`variant_name` of the device, which
    the controller writes into the claim's status (:data:`PREPARED_AS_KEY`)."""
    return f"{PREFIX[kind]}-{_short(identity, 16)}"


def in_fabric_pool(pool: str, fabric_pool: str) -> bool:
    """Whether ``pool`` is the fabric pool ``fabric_pool`` or one of its
    per-domain pools (``<fabric_pool>/<domain>``, ``<fabric_pool>/<domain>/<cut>``)."""
    return pool == fabric_pool or pool.startswith(fabric_pool + "/")


# A node's fabric adapters, published per node beside the per-domain pools so
# that a pairing claim can ask for one (docs/fabric.md, "Pairings"): the pool
# ``<fabric_pool>/adapters/<node>``, devices of this type. The node prepares
# nothing for one: the controller attaches the claim's fabric devices through it.
ADAPTERS = "adapters"
ADAPTER_TYPE = "fabricAdapter"


def adapter_pool(fabric_pool: str, node: str) -> str:
    return f"{fabric_pool}/{ADAPTERS}/{node}"


def is_adapter_pool(pool: str, fabric_pool: str) -> bool:
    """Whether ``pool`` is one of :func:`adapter_pool`'s (of any node)."""
    return pool.startswith(f"{fabric_pool}/{ADAPTERS}/")


def adapter_device_name(adapter: str) -> str:
    """``adapter-<adapter>`` when that is a DNS label, else ``adapter-<16 hex of its hash>``."""
    name = f"adapter-{adapter.lower()}"
    return name if len(name) <= 63 and _LABEL.match(name) else f"adapter-{_short(adapter, 16)}"


def counter_name(device_id: str) -> str:
    """A DNS-label counter name for a fabric device id."""
    name = device_id.lower()
    if len(name) <= 63 and _LABEL.match(name):
        return name
    return f"d-{_short(device_id, 16)}"


@dataclass(frozen=True)
class DeviceFailure:
    """An attached fabric GPU its node found failed (docs/health.md, "The
    fabric path"): the failure's class (``driver.health.classes``), the taint
    effect the node's policy gives that class, the reason (the taint value
    the node publishes a local GPU with, ``xid-79``) and since when (RFC 3339)."""

    failure_class: str
    effect: str
    reason: str
    since: str

    def to_json(self) -> dict[str, str]:
        return {"class": self.failure_class, "effect": self.effect, "reason": self.reason,
                "since": self.since}  # fmt: skip

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DeviceFailure:
        return cls(str(raw["class"]), str(raw["effect"]), str(raw["reason"]), str(raw["since"]))


@dataclass(frozen=True)
class NodeFabric:
    """What a node plugin reports about its fabric adapters (Node annotation)."""

    adapters: Mapping[str, str] = field(default_factory=dict)  # adapter -> pcieRoot
    gpus: Mapping[str, str] = field(default_factory=dict)  # attached GPU UUID -> adapter
    nics: Mapping[str, str] = field(default_factory=dict)  # attached NIC MAC -> adapter
    # Identities of attached devices a claim holds prepared: not to be detached yet.
    busy: frozenset[str] = frozenset()
    nvme: Mapping[str, str] = field(default_factory=dict)  # attached NVMe serial -> adapter
    # Attached CXL memory: the node's key (:func:`cxl_key`, or an older plugin's
    # bare serial) -> adapter.
    cxlmem: Mapping[str, str] = field(default_factory=dict)
    # Attached GPUs' board serials (NVML's) -> their UUID: a count-based manager names
    # what it attached by that serial only (docs/fabric.md, "Count-based managers").
    serials: Mapping[str, str] = field(default_factory=dict)
    # Attached devices (identity) the node found failed: the controller taints
    # them in the fabric pool and holds them out once detached.
    failed: Mapping[str, DeviceFailure] = field(default_factory=dict)

    def sees(self, kind: str, identity: str, adapter: str) -> bool:
        """Whether the node has the ``kind`` device ``identity`` behind ``adapter``
        (CXL memory: a serial sees any of its memdevs there, a key that one)."""
        return self.attached(kind).get(identity) == adapter or (
            kind == CXL_MEMORY and bool(self.memdevs(identity, adapter))
        )

    def attached(self, kind: str) -> Mapping[str, str]:
        """Identity -> adapter of the attached devices of ``kind``; CXL memory
        by the node's keys and by serial too (an MLD's LDs behind several
        adapters: the first adapter in order)."""
        if kind == CXL_MEMORY:
            serials: dict[str, str] = {}
            for key, adapter in sorted(self.cxlmem.items(), key=lambda kv: kv[1]):
                serials.setdefault(cxl_serial_of(key), adapter)
            return {**serials, **self.cxlmem}
        seen = {"gpu": self.gpus, "nic": self.nics, NVME: self.nvme}
        return seen.get(kind, {})

    def memdevs(self, serial: str, adapter: str) -> list[str]:
        """The node's keys (:func:`cxl_key`) of the CXL memdevs with ``serial``
        behind ``adapter``, in order; none from an older plugin (bare serials)."""
        return sorted(
            k for k, a in self.cxlmem.items()
            if a == adapter and cxl_bdf_of(k) and cxl_serial_of(k) == serial
        )  # fmt: skip

    def by_serial(self, serial: str) -> tuple[str, str] | None:
        """(GPU UUID, adapter) of the attached GPU whose board serial is ``serial``."""
        uuid = self.serials.get(serial.strip())
        return (uuid, self.gpus[uuid]) if uuid is not None and uuid in self.gpus else None

    def to_annotation(self) -> str:
        data = {"adapters": self.adapters, "gpus": self.gpus}
        # Omitted when empty: older controllers read the same text.
        more = (("nics", self.nics), (NVME, self.nvme), (CXL_MEMORY, self._cxl_with_serials()))
        for key, seen in (*more, ("serials", self.serials)):
            if seen:
                data[key] = seen
        body: dict[str, Any] = {k: dict(sorted(v.items())) for k, v in data.items()}
        if self.busy:
            body["busy"] = sorted(self.busy)
        if self.failed:
            body["failed"] = {k: v.to_json() for k, v in sorted(self.failed.items())}
        return json.dumps(body, separators=(",", ":"))

    def _cxl_with_serials(self) -> dict[str, str]:
        """The CXL keys, and the bare serial of a memdev alone with its serial on
        the node: what a controller from before the keys looks for (it reads
        the serial alone; :meth:`from_node` drops it again)."""
        out = dict(self.cxlmem)
        by_serial: dict[str, list[str]] = {}
        for key in self.cxlmem:
            by_serial.setdefault(cxl_serial_of(key), []).append(key)
        for serial, keys in by_serial.items():
            if len(keys) == 1 and serial not in out:
                out[serial] = self.cxlmem[keys[0]]
        return out

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
            nics = {str(k): str(v) for k, v in (data.get("nics") or {}).items()}
            nvme = {str(k): str(v) for k, v in (data.get(NVME) or {}).items()}
            cxlmem = {str(k): str(v) for k, v in (data.get(CXL_MEMORY) or {}).items()}
            keyed = {cxl_serial_of(k) for k in cxlmem if cxl_bdf_of(k)}
            cxlmem = {k: v for k, v in cxlmem.items() if cxl_bdf_of(k) or k not in keyed}
            busy = frozenset(str(i) for i in data.get("busy") or ())
            serials = {str(k): str(v) for k, v in (data.get("serials") or {}).items()}
            failed = {
                str(k): DeviceFailure.from_json(v) for k, v in (data.get("failed") or {}).items()
            }
        except (ValueError, AttributeError, TypeError, KeyError):
            return None
        return cls(adapters, gpus, nics, busy, nvme, cxlmem, serials, failed)
