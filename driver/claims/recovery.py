"""Start-up recovery: make the CDI directory and metadata files agree with the checkpoint.

Why a module: what a restarted plugin finds on disk after a crash at any
step (docs/design.md, "Failure model") is put right in one place, before
the sockets are served, under the claim lock (``driver.claims.preparer``
calls it in a worker thread): the temp files of an interrupted save go, the
checkpoint is compacted (its journal folded into the file every build
reads), a prepared claim's missing CDI spec is re-created from its record's
copy, GPU sharing is re-applied, and specs and metadata files that no record
owns are removed.
"""

from __future__ import annotations

import logging

from driver.checkpoint import Checkpoint, CheckpointStore, ClaimState
from driver.claims.claim_files import ClaimFiles
from driver.claims.threads import ThreadChoice
from driver.devices.handler import ClaimSharing
from driver.errors import PatchbayError

log = logging.getLogger(__name__)


def recover_files(
    checkpoint: Checkpoint,
    store: CheckpointStore,
    files: ClaimFiles,
    threads: ThreadChoice,
    sharing: ClaimSharing | None,
) -> tuple[int, int]:
    """(CDI specs re-created, orphaned specs removed)."""
    cdi, metadata = files.cdi, files.metadata
    store.remove_debris()
    store.compact(checkpoint)  # start from a current file
    cdi.remove_debris()
    restored = 0
    for uid, record in checkpoint.claims.items():
        if record.state is not ClaimState.PREPARE_COMPLETED or cdi.has_spec(uid):
            continue
        if record.cdi_spec is None:
            log.error("claim %s: its CDI spec is missing and its record has no copy", uid)
            continue
        log.warning("claim %s: re-creating its missing CDI spec", uid)
        cdi.write_spec(uid, record.cdi_spec)
        restored += 1
    for uid, record in checkpoint.claims.items():
        if record.state is ClaimState.PREPARE_COMPLETED and threads.shares(record):
            assert sharing is not None  # adopt what survived, redo what was lost
            try:
                sharing.apply(uid, [d.undo for d in record.devices])
            except PatchbayError as exc:  # the claim's pods are hit, not the node
                log.error("claim %s: its GPU sharing cannot be restored: %s", uid, exc)
    orphans = cdi.claim_uids() - set(checkpoint.claims)
    for uid in orphans:
        log.info("removing orphaned CDI spec of claim %s", uid)
        cdi.remove_claim_spec(uid)
    if metadata is not None:
        metadata.remove_debris()
        for uid in metadata.claim_uids() - set(checkpoint.claims):
            log.info("removing orphaned device metadata of claim %s", uid)
            metadata.remove_claim(uid)
        for uid, record in checkpoint.claims.items():
            if record.cdi_spec is not None and (gone := metadata.missing(record.cdi_spec)):
                log.error("claim %s: its device metadata files are missing: %s", uid, gone)
    return restored, len(orphans)
