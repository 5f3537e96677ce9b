"""Device metadata files on the host, and the CDI devices that mount them.

Why this module exists: the preparer (``driver.claims.preparer``) writes one
metadata file (:mod:`driver.claims.metadata`) per request of a claim before
the claim's CDI spec, and removes them after it; this is where they live and
how they get into a container. Files are under the plugin directory, next to
the checkpoint (the same lifetime: a reboot drops both), one flat directory
``<plugin dir>/dra-device-metadata/<claim UID>_<request>.json``, each written
atomically (``driver.atomicfile``, recycling one spare inode as the CDI
registry does). Named by claim UID, not by namespace and name as the Go
library's are: a deleted and re-created claim of the same name never shares
a file with its predecessor, and start-up finds the files no checkpointed
claim owns by their name alone. Flat, not a directory per claim and request
as the Go library has them: a directory costs a mkdir and an rmdir each
(0.1 ms apiece on a busy node's disk), a prepare+unprepare pair already
costs 0.4 ms without metadata.

The Go library mounts each file with a CDI spec of its own per request
(kind ``<driver>/metadata``). Here each request's mount is a device of the
claim's own spec instead (``<uid>-metadata_<request>``; ``_`` cannot occur
in a device name, a DNS label): one spec file per claim, written and removed
in one step, kept in the checkpoint record and re-created from it like the
rest of the spec, with nothing more for a crash to leave behind. The
kubelet and the runtime see the same thing: a CDI ID on the first device of
the request, which bind-mounts the file read-only at the upstream path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.atomicfile import StrPath, remove_stale_temps
from driver.cdi import CdiDevice, CdiRegistry, ContainerEdits, canonical_claim_uid
from driver.checkpoint import DeviceRecord
from driver.claims.metadata import (
    ClaimIdentity,
    MetadataDevice,
    base_request,
    container_path,
    stream,
)
from driver.errors import CdiError
from driver.sparefile import Spare

SUBDIR = "dra-device-metadata"  # under the plugin directory (the Go library's name)
SPARE = "metadata.spare.tmp"  # ".<SPARE>-<pid>-<random>": debris to driver.atomicfile
CDI_DEVICE_PREFIX = "metadata_"


def cdi_device_name(request: str) -> str:
    """The claim spec's device that mounts ``request``'s file."""
    return f"{CDI_DEVICE_PREFIX}{request}"


@dataclass(frozen=True)
class RequestFile:
    """One request's metadata file: its request (base name) and its mount."""

    request: str
    device: CdiDevice


class MetadataFiles:
    """Writes and removes the metadata files of claims under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._root = os.fspath(root)
        self.spare = Spare(root, SPARE)  # recycled between files, as CdiRegistry's

    @classmethod
    def in_plugin_dir(cls, plugin_dir: Path) -> MetadataFiles:
        return cls(plugin_dir / SUBDIR)

    def path(self, claim_uid: str, request: str) -> Path:
        return Path(self._file(canonical_claim_uid(claim_uid), base_request(request)))

    def _file(self, uid: str, base: str) -> str:
        """The file of canonical ``uid``'s request ``base``, joined as a str
        (the hot path: a Path costs a few microseconds to join and to encode)."""
        return f"{self._root}/{uid}_{base}.json"

    def write_claim(
        self, claim: ClaimIdentity, devices: Sequence[tuple[Sequence[str], MetadataDevice]]
    ) -> list[RequestFile]:
        """Write a file per request of ``devices`` ((request names, device), in
        the claim's order); the CDI devices mounting them, in request order."""
        by_request: dict[str, list[MetadataDevice]] = {}
        for requests, device in devices:
            for request in requests:
                by_request.setdefault(request, []).append(device)
        out: dict[str, RequestFile] = {}
        uid = canonical_claim_uid(claim.uid)
        for request, devs in by_request.items():
            base = base_request(request)
            path = self._file(uid, base)
            try:
                self.spare.create(path, stream(claim, request, devs))
            except OSError as exc:
                raise CdiError(
                    f"cannot write the device metadata of claim {claim.uid}, request "
                    f"{request}, in {self.root}: {exc}"
                ) from exc
            mount = (path, container_path(claim, base))
            out[base] = RequestFile(
                base, CdiDevice(cdi_device_name(base), ContainerEdits(mounts=(mount,)))
            )
        return list(out.values())

    def remove_claim(self, claim_uid: str, requests: Iterable[str] | None = None) -> int:
        """Remove the claim's files: those of ``requests`` (its records say
        which), or all there are; how many there were."""
        uid = canonical_claim_uid(claim_uid)
        paths: list[StrPath]
        if requests is None:
            paths = list(self.root.glob(f"{uid}_*.json")) if self.root.is_dir() else []
        else:
            paths = [self._file(uid, b) for b in dict.fromkeys(base_request(r) for r in requests)]
        try:
            return sum(self.spare.retire(p) for p in paths)
        except OSError as exc:
            raise CdiError(
                f"cannot remove the device metadata of claim {uid} in {self.root}: {exc}"
            ) from exc

    def claim_uids(self) -> set[str]:
        """UIDs of every claim with a file here."""
        if not self.root.is_dir():
            return set()
        out = set()
        for p in self.root.glob("*_*.json"):
            with contextlib.suppress(CdiError):
                out.add(canonical_claim_uid(p.name.split("_", 1)[0]))
        return out

    def remove_debris(self) -> int:
        """Temp files and spares a crash or another process left (start-up,
        under the claim lock)."""
        return remove_stale_temps(self.root)

    def missing(self, spec: Mapping[str, Any]) -> list[str]:
        """Files a claim's spec mounts from here that are not there (removed by
        hand: the container would not start)."""
        paths = [
            Path(m["hostPath"])
            for d in spec.get("devices") or ()
            for m in (d.get("containerEdits") or {}).get("mounts") or ()
        ]
        return [str(p) for p in paths if p.is_relative_to(self.root) and not p.is_file()]


def with_metadata_ids(
    records: Sequence[DeviceRecord], files: Sequence[RequestFile], uid: str
) -> None:
    """Add each file's CDI ID to the first device of its request, as the Go
    library does in its NodePrepareResources answer (kept in the record, so
    the answer after a restart is the same)."""
    ids = {f.request: CdiRegistry.device_id(uid, f.device.name) for f in files}
    for record in records:
        for base in dict.fromkeys(base_request(r) for r in record.request_names):
            if (cdi_id := ids.pop(base, None)) is not None:
                record.cdi_device_ids = [*record.cdi_device_ids, cdi_id]
