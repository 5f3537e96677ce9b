"""Container Device Interface specs, one file per prepared claim.

The kubelet hands the container runtime the CDI device IDs we return; the
runtime resolves them against the spec files in the CDI directory. Each
claim gets its own spec (``k8s.patchbay.dev-claim_<uid>.json``) so that
unprepare removes exactly that claim's devices and a crash leaves at most
one file to garbage-collect. Claim UIDs are validated as UUIDs before they
become part of a file name. Device nodes always carry type/major/minor so
the runtime never has to stat a host path that may not exist yet. The spec's
own ``containerEdits`` (control nodes, claim-wide variables such as
``NVIDIA_VISIBLE_DEVICES``) come with any of its devices; per-device edits
of one variable override each other in the container (docs/design.md).
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.atomicfile import remove_stale_temps
from driver.errors import CdiError
from driver.sparefile import Spare

CDI_VERSION = "0.6.0"
VENDOR = "k8s.patchbay.dev"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
FILE_PREFIX = f"{VENDOR}-{CLASS}_"


_CANONICAL_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_claim_uid(uid: str) -> str:
    """The claim UID in canonical form, or :class:`CdiError` if it is not a UUID."""
    if isinstance(uid, str) and _CANONICAL_UID.fullmatch(uid):
        return uid  # the apiserver's form: several calls per prepare skip the parse
    try:
        return str(uuid.UUID(uid))
    except (ValueError, TypeError, AttributeError) as exc:
        raise CdiError(f"claim UID {uid!r} is not a UUID") from exc


@dataclass(frozen=True)
class DeviceNode:
    path: str
    major: int
    minor: int
    type: str = "c"
    host_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "type": self.type,
            "major": self.major,
            "minor": self.minor,
        }
        if self.host_path and self.host_path != self.path:
            out["hostPath"] = self.host_path
        return out


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path), read-only binds
    # (host path, container path) binds the container writes to (an MPS pipe directory).
    writable_mounts: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_json() for n in self.device_nodes]
        mounts = [(h, c, "ro") for h, c in self.mounts]
        mounts += [(h, c, "rw") for h, c in self.writable_mounts]
        if mounts:
            out["mounts"] = [
                {"hostPath": h, "containerPath": c, "options": [mode, "nosuid", "nodev", "bind"]}
                for h, c, mode in mounts
            ]
        return out


@dataclass(frozen=True)
class CdiDevice:
    """One device of a claim's spec; ``name`` is the device's pool name."""

    name: str
    edits: ContainerEdits = field(default_factory=ContainerEdits)


_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class CdiRegistry:
    """Writes and removes the per-claim spec files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._root = os.fspath(root)
        # One file recycled between specs (driver.sparefile); its name ends
        # in neither .json nor .yaml, so runtimes never read it as a spec.
        self.spare = Spare(root, f"{VENDOR}-{CLASS}.spare.tmp")

    def remove_debris(self) -> int:
        """Temp files and spares of ours a crash or another process left (only
        while no other process may write: start-up, under the claim lock)."""
        return remove_stale_temps(self.root, f"{VENDOR}-{CLASS}")

    def spec_path(self, claim_uid: str) -> Path:
        return Path(self._spec_file(canonical_claim_uid(claim_uid)))

    def _spec_file(self, uid: str) -> str:
        """The spec of the claim with canonical ``uid``, joined as a str (the
        hot path: a Path costs a few microseconds to join and to encode)."""
        return f"{self._root}/{FILE_PREFIX}{uid}.json"

    @staticmethod
    def device_id(claim_uid: str, device_name: str) -> str:
        return f"{KIND}={canonical_claim_uid(claim_uid)}-{device_name}"

    def write_claim_spec(
        self,
        claim_uid: str,
        devices: Sequence[CdiDevice],
        common: ContainerEdits | None = None,
    ) -> list[str]:
        """Write the claim's spec atomically; the CDI IDs of its devices, in order."""
        spec = self.claim_spec(claim_uid, devices, common)
        self.write_spec(claim_uid, spec)
        return [self.device_id(claim_uid, d.name) for d in devices]

    def claim_spec(
        self,
        claim_uid: str,
        devices: Sequence[CdiDevice],
        common: ContainerEdits | None = None,
    ) -> dict[str, Any]:
        """The claim's spec as JSON data (what :meth:`write_spec` writes)."""
        uid = canonical_claim_uid(claim_uid)
        spec: dict[str, Any] = {
            "cdiVersion": CDI_VERSION,
            "kind": KIND,
            "devices": [
                {"name": f"{uid}-{d.name}", "containerEdits": d.edits.to_json()} for d in devices
            ],
        }
        if common is not None and common.to_json():
            spec["containerEdits"] = common.to_json()
        return spec

    def write_spec(self, claim_uid: str, spec: Mapping[str, Any]) -> None:
        """Write (or re-create) a claim's spec from its JSON data, atomically."""
        uid = canonical_claim_uid(claim_uid)
        try:
            data = json.dumps(spec, separators=(",", ":")).encode()
            self.spare.create(self._spec_file(uid), data)
        except OSError as exc:
            raise CdiError(f"cannot write CDI spec for claim {uid}: {self._why(exc)}") from exc

    def _why(self, exc: OSError) -> str:
        """The cause in words naming the directory (a claim's error is all an
        operator sees of a read-only or full CDI directory)."""
        if exc.errno in _NOT_WRITABLE:
            return f"CDI directory {self.root} is not writable ({exc.strerror})"
        return f"in CDI directory {self.root}: {exc}"

    def has_spec(self, claim_uid: str) -> bool:
        return self.spec_path(claim_uid).is_file()

    def remove_claim_spec(self, claim_uid: str) -> bool:
        try:
            return self.spare.retire(self._spec_file(canonical_claim_uid(claim_uid)))
        except OSError as exc:
            why = self._why(exc)
            raise CdiError(f"cannot remove CDI spec for claim {claim_uid}: {why}") from exc

    def claim_uids(self) -> set[str]:
        """UIDs of every claim that has a spec file here."""
        if not self.root.is_dir():
            return set()
        return {
            p.name[len(FILE_PREFIX) : -len(".json")] for p in self.root.glob(f"{FILE_PREFIX}*.json")
        }
