"""A prepared claim's files on the host: its device metadata files and its CDI spec.

Why a module: the preparer (``driver.claims.preparer``) writes them once
the claim's devices are prepared and removes them once they are given back,
and the order between them is what a container depends on: the metadata
files are on disk before the spec that mounts them (KEP-5304), and the spec
goes before the files, so no spec ever mounts a missing file. Both
directories recycle a spare file (``driver.sparefile``), which the preparer
opens while a prepare's GET is in flight (:meth:`ClaimFiles.open_spares`).

Concurrency: the preparer holds its state lock around :meth:`ClaimFiles.write`
and :meth:`ClaimFiles.remove` (they share the spares and feed the records);
:meth:`ClaimFiles.open_spares` takes turns with a write on each spare's own
lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from driver.cdi import CdiRegistry
from driver.checkpoint import DeviceRecord
from driver.claims.metadata import ClaimIdentity, MetadataDevice
from driver.claims.metadata_files import MetadataFiles, with_metadata_ids
from driver.claims.results import ClaimEdits, unique_devices


class ClaimFiles:
    """The CDI registry and (when on) the metadata files, in their order."""

    def __init__(self, cdi: CdiRegistry, metadata: MetadataFiles | None) -> None:
        self.cdi = cdi
        self.metadata = metadata

    def open_spares(self) -> None:
        """Open the spares of the files a prepare writes, ahead of the writes."""
        self.cdi.spare.open_ahead()
        if self.metadata is not None:
            self.metadata.spare.open_ahead()

    def write(
        self,
        uid: str,
        devices: Sequence[DeviceRecord],
        edits: ClaimEdits,
        described: Sequence[tuple[Sequence[str], MetadataDevice]],
        identity: ClaimIdentity | None,
    ) -> dict[str, Any]:
        """The claim's metadata files (with ``identity``), then its spec; each
        device record gets its CDI IDs. Returns the spec written."""
        files = []
        if self.metadata is not None and identity is not None:
            files = self.metadata.write_claim(identity, described)
        unique = unique_devices(edits.devices + [f.device for f in files])
        spec = self.cdi.claim_spec(uid, unique, edits.merged())
        self.cdi.write_spec(uid, spec)
        for record in devices:
            record.cdi_device_ids = [self.cdi.device_id(uid, record.device_name)]
        with_metadata_ids(devices, files, uid)
        return spec

    def remove(self, uid: str, requests: Iterable[str] | None = None) -> None:
        """The claim's spec, then its metadata files: those of ``requests``
        (its records say which), or all there are."""
        self.cdi.remove_claim_spec(uid)
        if self.metadata is not None:
            self.metadata.remove_claim(uid, requests)
