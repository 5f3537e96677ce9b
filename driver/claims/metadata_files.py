"""Device metadata files on the host, and the CDI devices that mount them.

Why this module exists: the preparer (``driver.claims.preparer``) writes one
metadata file (:mod:`driver.claims.metadata`) per request of a claim before
the claim's CDI spec, and removes them after it; this is where they live and
how they get into a container. Files are under the plugin directory, next to
the checkpoint (the same lifetime: a reboot drops both),
``<plugin dir>/dra-device-metadata/<claim UID>/<request>/metadata.json``,
each written atomically (``driver.atomicfile``). Named by claim UID, not by
namespace and name as the Go library's are: a deleted and re-created claim of
the same name never shares a directory with its predecessor, and start-up
finds the directories no checkpointed claim owns by their name alone.

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
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.atomicfile import write_atomic
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

log = logging.getLogger(__name__)

SUBDIR = "dra-device-metadata"  # under the plugin directory (the Go library's name)
FILE_NAME = "metadata.json"
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

    @classmethod
    def in_plugin_dir(cls, plugin_dir: Path) -> MetadataFiles:
        return cls(plugin_dir / SUBDIR)

    def claim_dir(self, claim_uid: str) -> Path:
        return self.root / canonical_claim_uid(claim_uid)

    def path(self, claim_uid: str, request: str) -> Path:
        return self.claim_dir(claim_uid) / base_request(request) / FILE_NAME

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
        for request, devs in by_request.items():
            base = base_request(request)
            path = self.path(claim.uid, base)
            try:
                write_atomic(path, stream(claim, request, devs))
            except OSError as exc:
                raise CdiError(
                    f"cannot write the device metadata of claim {claim.uid}, request "
                    f"{request}, in {self.root}: {exc}"
                ) from exc
            mount = (str(path), container_path(claim, base))
            out[base] = RequestFile(
                base, CdiDevice(cdi_device_name(base), ContainerEdits(mounts=(mount,)))
            )
        return list(out.values())

    def remove_claim(self, claim_uid: str) -> bool:
        """Remove the claim's files (True if there were any)."""
        directory = self.claim_dir(claim_uid)
        if not directory.exists():
            return False
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise CdiError(
                f"cannot remove the device metadata of claim {claim_uid} in {self.root}: {exc}"
            ) from exc
        return True

    def claim_uids(self) -> set[str]:
        """UIDs of every claim with a directory here."""
        if not self.root.is_dir():
            return set()
        out = set()
        for p in self.root.iterdir():
            with contextlib.suppress(CdiError):
                out.add(canonical_claim_uid(p.name))
        return out

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
