"""Prepare and unprepare claims: the driver's answer to the kubelet.

For each claim of a call: GET the ResourceClaim, check it (UID, allocated,
our pools), plan it (driver.claims.plan: decode its opaque configs, refuse
devices that another claim holds), record ``PrepareStarted`` in the checkpoint,
let each device's handler do its work, write the claim's CDI spec and record
``PrepareCompleted``.
Every claim gets its own result: an error in one never fails the others.

Concurrency: each claim holds the keys of the devices it touches
(``driver.claims.keys``, ``driver.claims.lock``): claims on different
devices run side by side, claims on one device or one GPU take turns, and
recovery, compaction and claims whose devices are not known take the lock
whole (so does every claim during a rolling update, when the lock is shared
with another process). The API reads happen on the loop before any lock
(``driver.claims.fetch``). A claim with a device whose handler may block
(NVML, sysfs: the handler's ``blocking``) is prepared or unprepared in a
worker thread; a claim that needs only CDI edits (full GPUs without dynamic
MIG) on the loop itself, where its work is two unsynced file replacements
and a journal entry (its device nodes come from ``driver.gpu.device_dir``;
a thread hop costs more than that on a busy node). What keyed claims share
(the checkpoint and its holdings index, its journal, the CDI and metadata
files' spare) is touched only under ``self._state``, a short thread lock:
the device work runs outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from driver.cdi import CdiRegistry, canonical_claim_uid
from driver.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, ClaimState
from driver.claims import admin
from driver.claims.allocation import Allocation, parse_allocation
from driver.claims.claim_files import ClaimFiles
from driver.claims.compaction import RestCompaction
from driver.claims.fetch import ClaimReader, read_claims
from driver.claims.keys import Seen, prepare_keys, undo_keys
from driver.claims.lock import ClaimLock, KeyedHold
from driver.claims.metadata import ClaimIdentity, MetadataDevice
from driver.claims.metadata_files import MetadataFiles
from driver.claims.model import ClaimRef, Fetched, PrepareResult, log_fields
from driver.claims.plan import Holdings, Planned, plan_claim
from driver.claims.recovery import recover_files
from driver.claims.results import ClaimEdits, result_of
from driver.claims.threads import ThreadChoice
from driver.devices.handler import ClaimSharing, DeviceHandler, Inventory, changes_device
from driver.errors import CheckpointError, ClaimError, ConfigError, PatchbayError
from driver.faults import crash_point
from driver.kube.reservations import more_pods, pods_of
from driver.metrics import (
    PREPARE_CALLS,
    PREPARE_SECONDS,
    PREPARED_CLAIMS,
    UNPREPARE_CALLS,
    UNPREPARE_SECONDS,
)

log = logging.getLogger(__name__)


class ClaimPreparer:
    """The :class:`driver.claims.model.ClaimHandler` of the node plugin."""

    def __init__(
        self,
        reader: ClaimReader,
        inventory: Inventory,
        handlers: Mapping[str, DeviceHandler],
        store: CheckpointStore,
        cdi: CdiRegistry,
        lock: ClaimLock | None = None,
        sharing: ClaimSharing | None = None,
        metadata: MetadataFiles | None = None,
    ) -> None:
        self._reader = reader
        self._inventory = inventory
        self._handlers = dict(handlers)
        self._store = store
        self._sharing = sharing  # claim-wide GPU sharing (driver.gpu.sharing)
        self._threads = ThreadChoice(self._handlers, sharing)  # loop or worker thread
        self._files = ClaimFiles(cdi, metadata)  # the CDI spec, metadata files (KEP-5304)
        self._lock = lock if lock is not None else ClaimLock()
        self._state = threading.Lock()  # what keyed claims share (module docstring)
        # During a rolling update two plugin processes share the checkpoint
        # (and the lock, through its file), so each call starts from what is
        # on disk (re-read when it changed).
        self._shared = self._lock.shared
        self.checkpoint: Checkpoint = store.current()
        self._taken = Holdings.of(self.checkpoint, self._handlers)  # kept as records change
        self.rest = RestCompaction(lambda: store.pending, self.compact, self._calls_loop)
        PREPARED_CLAIMS.set(len(self.checkpoint.claims))
        # Called on the loop after every prepare/unprepare batch (the node's
        # fabric report says which fabric devices are held).
        self.on_change: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the calls' loop, once one came

    @property
    def lock(self) -> ClaimLock:
        """The lock of prepare, unprepare and recovery (``driver.claims.lock``);
        ``async with`` it holds it whole."""
        return self._lock

    @property
    def shared_checkpoint(self) -> bool:
        """Whether each call re-reads the checkpoint another process may write."""
        return self._shared

    def _calls_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the calls run on, taken at the first (a lookup reads the
        process id on 3.11; the compaction timer asks for it too)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _soon(self, callback: Callable[[], None]) -> None:
        """``callback`` once the running task yields (loop.call_soon)."""
        self._calls_loop().call_soon(callback)

    def _changed(self) -> None:
        """After a call: its listeners (the node's fabric report, the GPU
        recovery) and the compaction timer, once the call's answer is written
        (the server writes it in the same step of the call's task); the
        kubelet does not wait for what they do."""
        self._soon(self._after_call)

    def _after_call(self) -> None:
        if self.on_change is not None:
            self.on_change()
        self.rest.after_call()

    async def compact(self) -> None:
        """Write the whole checkpoint if its journal holds entries, under the
        claim lock (at rest, and at a graceful stop). A failure is logged:
        the journal still holds everything."""
        self.rest.cancel()
        async with self._lock:
            self._reload_if_shared()
            try:
                if self._store.compact(self.checkpoint):
                    log.debug("checkpoint compacted (%d claims)", len(self.checkpoint.claims))
            except CheckpointError as exc:
                log.warning("checkpoint compaction failed (its journal is kept): %s", exc)

    # -- public API -------------------------------------------------------

    async def read(self, claims: Sequence[ClaimRef]) -> Fetched:
        """The API reads of a prepare, taken before any lock (driver.claims.fetch);
        meanwhile, the spares of the files a prepare writes are opened
        (``driver.sparefile``): the writes after it start open."""
        self._soon(self._files.open_spares)
        return await read_claims(self._reader, claims, self._needs_read)

    def _needs_read(self, uid: str) -> bool:
        record = self.checkpoint.claims.get(uid)
        return record is None or record.state is not ClaimState.PREPARE_COMPLETED

    async def prepare(
        self, claims: Sequence[ClaimRef], fetched: Fetched | None = None
    ) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        started = time.perf_counter()
        if fetched is None:
            fetched = await self.read(claims)
        for ref in claims:
            try:
                results[ref.uid] = await self._prepare_held(ref, fetched.get(ref.uid))
                PREPARE_CALLS.labels(result="ok").inc()
                if log.isEnabledFor(logging.DEBUG):  # a line costs ~1 % of a prepare
                    log.debug(
                        "prepared %s/%s (%s)", ref.namespace, ref.name, ref.uid,
                        extra=log_fields(ref, fetched.get(ref.uid), results[ref.uid]),
                    )  # fmt: skip
            except PatchbayError as exc:
                log.warning(
                    "prepare %s/%s (%s) failed: %s", ref.namespace, ref.name, ref.uid, exc,
                    extra=log_fields(ref, fetched.get(ref.uid)),
                )  # fmt: skip
                results[ref.uid] = PrepareResult(error=str(exc))
                PREPARE_CALLS.labels(result="error").inc()
            except Exception as exc:
                log.exception(
                    "prepare %s/%s (%s): internal error", ref.namespace, ref.name, ref.uid,
                    extra=log_fields(ref, fetched.get(ref.uid)),
                )  # fmt: skip
                results[ref.uid] = PrepareResult(error=f"internal error: {exc!r}")
                PREPARE_CALLS.labels(result="error").inc()
        PREPARE_SECONDS.observe(time.perf_counter() - started)
        self._changed()
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        results: dict[str, str] = {}
        started = time.perf_counter()
        for ref in claims:
            try:
                await self._unprepare_held(ref.uid)
                results[ref.uid] = ""
                UNPREPARE_CALLS.labels(result="ok").inc()
            except Exception as exc:
                log.warning(
                    "unprepare %s/%s (%s) failed: %s", ref.namespace, ref.name, ref.uid, exc,
                    extra=log_fields(ref),
                )  # fmt: skip
                results[ref.uid] = str(exc)
                UNPREPARE_CALLS.labels(result="error").inc()
        UNPREPARE_SECONDS.observe(time.perf_counter() - started)
        self._changed()
        return results

    def prepared_devices(self) -> set[tuple[str, str]]:
        """(kind, local id) of every device some claim holds or is preparing:
        read from the holdings index, not from every record (it is asked after
        every call, for the node's fabric report, and at every metrics scrape)."""
        with self._state:
            self._taken.sync(self.checkpoint)  # rebuilt only if the checkpoint was read again
            return self._taken.devices()

    async def recover(self) -> tuple[int, int]:
        """Start-up: make the CDI directory agree with the checkpoint.

        Re-creates the spec of every prepared claim whose spec is missing
        (from the copy its record keeps) and removes specs no checkpointed
        claim owns (debris of a crash); also removes temp files of an
        interrupted save, under the claim lock (another plugin process
        may be preparing). Returns (re-created, removed).
        """
        async with self._lock:
            self._reload_if_shared()
            return await asyncio.to_thread(self._recover_sync)

    def _recover_sync(self) -> tuple[int, int]:
        return recover_files(
            self.checkpoint, self._store, self._files, self._threads, self._sharing
        )

    # -- prepare ----------------------------------------------------------

    def _reload_if_shared(self) -> None:
        """Another plugin process may have written the shared checkpoint; read
        it again only if the file changed since this process read or wrote it."""
        if self._shared and self._store.changed():
            self.checkpoint = self._store.load()

    # -- the keys a claim holds (driver.claims.keys) ------------------------

    async def _prepare_held(
        self, ref: ClaimRef, claim: Mapping[str, Any] | BaseException | None
    ) -> PrepareResult:
        canonical_claim_uid(ref.uid)
        seen = Seen.of(self.checkpoint, ref.uid)
        keys, allocation = prepare_keys(self.checkpoint, self._inventory, ref.uid, claim)
        async with self._lock.keyed(keys) as hold:
            self._reload_if_shared()
            if not isinstance(hold, KeyedHold) or seen.still(self.checkpoint):
                return await self._prepare_one(ref, claim, allocation)
        # Another call changed the record while we waited (the claim's own key
        # kept it out until then): its keys may be others now, take it whole.
        async with self._lock:
            self._reload_if_shared()
            return await self._prepare_one(ref, claim, None)

    async def _unprepare_held(self, uid: str) -> None:
        seen = Seen.of(self.checkpoint, uid)
        async with self._lock.keyed(undo_keys(self.checkpoint, self._inventory, uid)) as hold:
            self._reload_if_shared()
            if not isinstance(hold, KeyedHold) or seen.still(self.checkpoint):
                return await self._unprepare_one(uid)
        async with self._lock:  # a prepare recorded the claim while we waited
            self._reload_if_shared()
            await self._unprepare_one(uid)

    async def _unprepare_one(self, uid: str) -> None:
        record = self.checkpoint.claims.get(uid)
        if record is None or not self._threads.for_undo(record):
            self._unprepare_sync(uid)
        else:
            await asyncio.to_thread(self._unprepare_sync, uid)

    async def _prepare_one(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any] | BaseException | None,
        allocation: Allocation | None,
    ) -> PrepareResult:
        record = self.checkpoint.claims.get(ref.uid)
        if record is not None and record.state is ClaimState.PREPARE_COMPLETED:
            if isinstance(claim, Mapping):
                record.pods = more_pods(record.pods, claim)  # another pod of the claim
            return result_of(record)
        if isinstance(claim, BaseException):
            raise claim
        if claim is None:  # not fetched (e.g. completed meanwhile by another call)
            claim = await self._reader.read_claim(ref.namespace, ref.name)
        if allocation is None:
            allocation = parse_allocation(claim, ref.uid, self._inventory.pools())
        identity = ClaimIdentity.of(claim, ref.uid) if self._files.metadata is not None else None
        kinds = [
            d.kind
            for r in allocation.devices
            if (d := self._inventory.lookup(r.pool, r.device)) is not None
        ]
        params = [c.parameters for c in allocation.configs]
        pods = pods_of(claim)
        if not self._threads.for_prepare(kinds, params, record):
            return self._prepare_sync(ref, allocation, identity, pods)
        return await asyncio.to_thread(self._prepare_sync, ref, allocation, identity, pods)

    def _prepare_sync(
        self,
        ref: ClaimRef,
        allocation: Allocation,
        identity: ClaimIdentity | None = None,
        pods: list[str] | None = None,
    ) -> PrepareResult:
        stale = self.checkpoint.claims.get(ref.uid)
        if stale is not None:
            log.info("claim %s: undoing an interrupted prepare before retrying", ref.uid)
            self._undo(stale)
        with self._state:
            planned = plan_claim(
                ref, allocation, self.checkpoint, self._inventory, self._handlers, self._sharing,
                self._taken,
            )  # fmt: skip
            record = ClaimRecord(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                state=ClaimState.PREPARE_STARTED,
                devices=[p[0] for p in planned],
                pods=pods,
            )
            self.checkpoint.claims[ref.uid] = record
            self._taken.add(self.checkpoint, record)
            # PrepareStarted must be on disk before a handler changes hardware
            # (MIG instances, driver binding); CDI-only devices have nothing to
            # undo but a spec file, which start-up recovery removes.
            if self._threads.shares(record) or any(
                changes_device(self._handlers[device.kind], config) for _, device, config in planned
            ):
                self._store.record(self.checkpoint, ref.uid)
        crash_point("prepare-recorded")
        try:
            return self._apply(ref, record, planned, identity)
        except Exception:
            # Leave nothing behind: undo what the handlers did so far.
            try:
                self._undo(record)
            except Exception:
                log.exception("claim %s: rollback after a failed prepare failed", ref.uid)
            raise

    def _apply(
        self,
        ref: ClaimRef,
        record: ClaimRecord,
        planned: list[Planned],
        identity: ClaimIdentity | None = None,
    ) -> PrepareResult:
        gathered = ClaimEdits()
        described: list[tuple[list[str], MetadataDevice]] = []  # for the metadata files
        for device_record, device, config in planned:
            handler = self._handlers[device.kind]
            prep = admin.prepare(handler, device, config, device_record, self.checkpoint, ref.uid)
            device_record.undo = {**device_record.undo, **prep.undo}
            crash_point("prepare-device-done")
            gathered.add(device.name, prep, handler.common_edits())
            meta = MetadataDevice.of(device_record.pool_name, device, prep.network)
            described.append((device_record.request_names, meta))
        if self._sharing is not None:
            gathered.add_common(self._sharing.apply(ref.uid, [d.undo for d in record.devices]))
        with self._state:  # the files' spares, the records, the journal
            # The spec is on disk before the record says completed, and the record
            # keeps a copy: a prepared claim never points at a missing spec.
            record.cdi_spec = self._files.write(
                ref.uid, record.devices, gathered, described, identity
            )
            crash_point("prepare-cdi-written")
            record.state = ClaimState.PREPARE_COMPLETED
            self._store.record(self.checkpoint, ref.uid)
            crash_point("prepare-completed")
            PREPARED_CLAIMS.set(len(self.checkpoint.claims))
        return result_of(record)

    # -- unprepare --------------------------------------------------------

    def _unprepare_sync(self, uid: str) -> None:
        record = self.checkpoint.claims.get(uid)
        if record is None:
            # Idempotent: nothing recorded; still drop a spec a crash left behind.
            with self._state, contextlib.suppress(PatchbayError):
                self._files.remove(uid)
            return
        self._undo(record)

    def _undo(self, record: ClaimRecord) -> None:
        if (why := record.not_understood(self._handlers)) is not None:  # docs/design.md, "Upgrades"
            raise ClaimError(
                f"claim {record.uid}: its checkpoint record has {why}, written by a newer build "
                "of patchbay (or one with that device family enabled); left untouched"
            )
        if self._sharing is not None:
            self._sharing.undo(record.uid, [d.undo for d in record.devices])
        for device in record.devices:
            if not admin.is_admin(device):  # a read-only view has nothing to undo
                self._handlers[device.kind].unprepare(device.kind, device.local_id, device.undo)
        crash_point("unprepare-devices-undone")
        with self._state:
            # The record goes before the spec: a spec without a record is debris
            # start-up removes, a prepared record without its spec must not be.
            del self.checkpoint.claims[record.uid]
            self._taken.remove(self.checkpoint, record.uid)
            self._store.record(self.checkpoint, record.uid)
            crash_point("unprepare-recorded")
            self._files.remove(record.uid, [r for d in record.devices for r in d.request_names])
            PREPARED_CLAIMS.set(len(self.checkpoint.claims))


__all__ = ["ClaimPreparer", "ClaimReader", "ConfigError"]
