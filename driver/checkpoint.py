"""The plugin's record of prepared claims, kept across restarts and upgrades.

The kubelet may call unprepare after the claim object is gone, and a
crashed plugin must finish or undo what it started, so every prepare is
recorded in two phases: ``PrepareStarted`` (written before any side effect,
listing the devices about to be touched) and ``PrepareCompleted``, which
carries the claim's CDI spec so start-up can re-create a spec that went
missing.

The file is a versioned pydantic model written atomically. Newer versions may
add fields with defaults and unknown fields are kept, so an upgrade or a
rollback never loses information (there is deliberately no checksum, which
would break on added fields). A claim state this build does not know is kept
as its string, and :meth:`ClaimRecord.not_understood` says why this build
must leave such a record alone (docs/design.md, "Upgrades and downgrades";
``tests/fixtures/checkpoint-v1`` is a file every later build must read). A
file that cannot be parsed is moved aside under a ``.corrupt-<time>`` name
and reported, never silently ignored. When the node's boot id changes every
record is dropped: a reboot undid the devices' state. That rule is why
nothing here is fsynced: only a reboot (power loss, kernel crash) loses
unsynced writes, and after one the file is dropped whatever it holds
(docs/design.md, "Failure model").

A prepare or unprepare does not rewrite the file: the one record that
changed is appended to the checkpoint's journal (``driver.journal``), and
the whole file is written again (a compaction) once the journal holds as
many entries as the node has claims (and at least :data:`COMPACT_FROM`),
when the plugin is at rest, at its start and at a graceful stop. A reader
replays the journal over the file. Builds before the journal read only the
file, which is therefore always the format every build reads, current
whenever the plugin is at rest (docs/design.md, "Upgrades and downgrades",
says what a rollback sees).

The records are read in one place: ``driver.holdings`` turns them into typed
``Holding`` values (which claim holds which device, as a share, or
as a record only a newer build understands), which the claim planner
(``driver.claims.plan``) and the MIG start-up and guard
(``driver.mig.startup``) both use. One :class:`CheckpointStore` per process
owns the file; whoever must follow what another process (a rolling
update's other plugin pod) records subscribes with
:meth:`CheckpointStore.follow` and sees every checkpoint read from disk.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Collection
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from driver.atomicfile import remove_file, remove_stale_temps, write_atomic
from driver.errors import CheckpointError
from driver.journal import Appender, journal_path
from driver.journal import append as journal_append
from driver.journal import entries as journal_entries
from driver.journal import entry as journal_entry

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
# A compaction is due once the journal holds as many entries as the node has
# claims, and never before it holds this many: a node with few claims
# compacts every so many changes, not at every other one. Every change is
# journaled, however few the claims: the entry is one write on the held
# journal, a whole file five syscalls (open, write, truncate, close,
# rename), each 3-5x dearer on a node between calls than in a loop
# (docs/figures.md, "Where a prepare's time went inside the plugin").
COMPACT_FROM = 16

# Keys of a device record's undo data that every reader interprets alike.
ADMIN_ACCESS = "adminAccess"  # an admin-access view (driver.claims.admin): holds nothing
# The allocation's shareID of a device shared through consumable capacity,
# kept in the undo data so the checkpoint format holds.
SHARE_ID = "shareID"


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


# A known state parses to its member; any other string (a newer build's) is
# kept as written, never a reason to move the whole file aside.
StateValue = Annotated[ClaimState | str, Field(union_mode="left_to_right")]


class DeviceRecord(BaseModel):
    """One device prepared (or being prepared) for a claim."""

    model_config = ConfigDict(extra="allow")

    request_names: list[str]
    pool_name: str
    device_name: str
    kind: str
    local_id: str
    cdi_device_ids: list[str] = Field(default_factory=list)
    # Whatever the device type needs to undo its preparation (e.g. a MIG GPU
    # instance id, the VF's original kernel driver).
    undo: dict[str, Any] = Field(default_factory=dict)

    @property
    def admin_access(self) -> bool:
        """Whether the record is a read-only view, which holds nothing."""
        return bool(self.undo.get(ADMIN_ACCESS))

    @property
    def share_id(self) -> str | None:
        """The share's ID when the device is one share of a shareable device."""
        value = self.undo.get(SHARE_ID)
        return str(value) if value is not None else None


class ClaimRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    uid: str
    namespace: str
    name: str
    state: StateValue
    devices: list[DeviceRecord] = Field(default_factory=list)
    updated: float = Field(default_factory=time.time)
    # The CDI spec written for the claim (set with PrepareCompleted), so that
    # start-up can re-create it; None in records of older versions.
    cdi_spec: dict[str, Any] | None = None
    # UIDs of the pods status.reservedFor named at prepare (a share's processes
    # are mapped to its claim by them, driver.idle.shares); None where not
    # known: records of older versions, a claim reserved for a PodGroup (then
    # left out of the file: a resave keeps a record as written).
    pods: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)

    def not_understood(self, kinds: Collection[str]) -> str | None:
        """What in this record this build cannot act on, given the device
        kinds it has handlers for: a state or a device kind only a newer build
        (or one with another device family enabled) knows; None if nothing."""
        if not isinstance(self.state, ClaimState):
            return f"state {self.state!r}"
        unknown = sorted({d.kind for d in self.devices if d.kind not in kinds})
        if unknown:
            return "device kind " + ", ".join(repr(k) for k in unknown)
        return None


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: int = CHECKPOINT_VERSION
    boot_id: str = ""
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


def _misfiled(checkpoint: Checkpoint) -> str | None:
    """Why the file cannot be this driver's: every build keys a record by its
    claim's UID, a UUID. A file that does not is corrupt, not a newer format
    (its records could never be unprepared, a non-UUID never names a CDI spec)."""
    for key, record in checkpoint.claims.items():
        if key != record.uid:
            return f"claims[{key!r}] holds the record of claim {record.uid!r}"
        try:
            uuid.UUID(key)
        except ValueError:
            return f"claims[{key!r}] is not keyed by a claim UID"
    return None


class CheckpointStore:
    """Loads and saves the checkpoint file and its journal; one owner per process.

    :meth:`record` journals one claim's change (O(1), ``driver.journal``);
    :meth:`save` writes the whole file (format 1) and removes the journal: a
    compaction, due when the journal holds as many entries as the node has
    claims and at least :data:`COMPACT_FROM` (amortised O(1)), and done by
    :meth:`compact` when the preparer is at rest, at start-up and at a
    graceful stop. Where no other process writes them, the journal is held
    open between entries (``driver.journal.Appender``)."""

    def __init__(self, path: Path, boot_id: str, *, shared: bool = True) -> None:
        self.path = path
        self.journal = journal_path(path)
        self.boot_id = boot_id
        # Whether another process may write the files (a rolling update's
        # other plugin pod): only then is their identity kept after each
        # write (a stat per save), for :meth:`changed`.
        self.shared = shared
        self.moved_aside: Path | None = None
        self._seen: _Identity | None = (None, None)  # the files last read or written
        self._current: Checkpoint | None = None
        self._followers: list[Callable[[Checkpoint], None]] = []
        self._encoded: dict[str, tuple[ClaimRecord, bytes]] = {}  # completed records' JSON
        self._entries = 0  # journal entries not yet compacted into the file
        self._appender = None if shared else Appender(self.journal)

    @property
    def pending(self) -> int:
        """Journal entries the file does not hold yet (0: the file is current)."""
        return self._entries

    def follow(self, follower: Callable[[Checkpoint], None]) -> None:
        """Call ``follower`` with every checkpoint read from disk from now on
        (the first read, and each re-read of a file another process wrote)."""
        self._followers.append(follower)

    def current(self) -> Checkpoint:
        """The checkpoint this process last read or saved; read on first use."""
        return self._current if self._current is not None else self.load()

    def _identity(self) -> _Identity:
        return (_stat_identity(self.path), _stat_identity(self.journal))

    def changed(self) -> bool:
        """Whether the file or the journal is another than this store last read
        or wrote (inode, size, mtime): only then must a shared checkpoint be
        read again. Every save replaces the file, so its inode changes; every
        entry grows the journal. Never, for a store no other process writes."""
        return self.shared and self._identity() != self._seen

    def load(self) -> Checkpoint:
        """The stored checkpoint, an empty one if there is none, read anew
        with its journal replayed (and handed to every follower).

        A corrupt file is moved aside (its new name is logged) and an empty
        checkpoint returned; the caller learns of it from the log and the
        ``moved_aside`` attribute.
        """
        identity = self._identity()
        checkpoint = self._read()
        self._replay(checkpoint)
        self._seen = identity if self.moved_aside is None else None
        self._current = checkpoint
        for follower in self._followers:
            follower(checkpoint)
        return checkpoint

    def _replay(self, checkpoint: Checkpoint) -> None:
        """Apply the journal's entries of this boot to ``checkpoint``."""
        try:
            raw = self.journal.read_bytes()
        except FileNotFoundError:
            self._entries = 0
            return
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint journal {self.journal}: {exc}") from exc
        self._entries = raw.count(b"\n")
        for uid, data in journal_entries(raw, self.boot_id, self.journal):
            if data is None:
                checkpoint.claims.pop(uid, None)
                continue
            try:
                record = ClaimRecord.model_validate(data)
            except ValidationError as exc:
                log.error("%s: the entry of claim %s is not a record; skipped: %s",
                          self.journal, uid, exc.errors()[0].get("msg", exc))  # fmt: skip
                continue
            if record.uid != uid:
                log.error("%s: the entry of claim %s holds claim %s; skipped",
                          self.journal, uid, record.uid)  # fmt: skip
                continue
            checkpoint.claims[uid] = record

    def _read(self) -> Checkpoint:
        self.moved_aside = None
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Checkpoint(boot_id=self.boot_id)
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {exc}") from exc
        if not raw:
            # Only power loss leaves it so (its data never written back): the
            # reboot undid what it recorded.
            log.warning(
                "checkpoint %s is empty (lost in a power failure?); starting empty", self.path
            )
            return Checkpoint(boot_id=self.boot_id)
        try:
            checkpoint = Checkpoint.model_validate_json(raw)
            why = _misfiled(checkpoint)
        except ValidationError as exc:
            why = str(exc.errors()[0].get("msg", exc))
        if why is not None:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.rename(aside)
            self.moved_aside = aside
            log.error(
                "checkpoint %s is corrupt and was moved to %s; starting empty. "
                "Claims prepared before cannot be unprepared automatically "
                "(after power loss this is expected: a reboot undid them): %s",
                self.path,
                aside,
                why,
            )
            return Checkpoint(boot_id=self.boot_id)
        if checkpoint.version > CHECKPOINT_VERSION:
            log.warning(
                "checkpoint %s has version %d, newer than %d; unknown fields are kept",
                self.path,
                checkpoint.version,
                CHECKPOINT_VERSION,
            )
        if checkpoint.boot_id != self.boot_id:
            if checkpoint.claims:
                log.info(
                    "boot id changed (%s -> %s): dropping %d claim records",
                    checkpoint.boot_id or "none",
                    self.boot_id,
                    len(checkpoint.claims),
                )
            checkpoint = Checkpoint(boot_id=self.boot_id)
        return checkpoint

    def remove_debris(self) -> int:
        """Remove temp files a crash left in the middle of a save. Only while
        no other process may be saving (start-up, under the claim lock)."""
        return remove_stale_temps(self.path.parent, self.path.name)

    def encode(self, checkpoint: Checkpoint) -> bytes:
        """The file's bytes: the model's JSON, each claim's record serialised
        once. A ``PrepareCompleted`` record is never changed, only dropped or
        replaced (the preparer finishes a record before it says completed),
        so its JSON is kept from the save that first wrote it while the same
        record object is still completed: a save serialises the records that
        changed, not every claim on the node (tests/bench/checkpoint_bench.py)."""
        encoded: dict[str, tuple[ClaimRecord, bytes]] = {}
        parts: list[bytes] = []
        for uid, record in checkpoint.claims.items():
            done = record.state is ClaimState.PREPARE_COMPLETED
            kept = self._encoded.get(uid)
            data = kept[1] if done and kept is not None and kept[0] is record else None
            if data is None:
                data = json.dumps(uid).encode() + b":" + record.model_dump_json().encode()
            if done:
                encoded[uid] = (record, data)  # holds the record: its id is not reused
            parts.append(data)
        self._encoded = encoded
        head = checkpoint.model_dump_json(exclude={"claims"}).encode()
        return head[:-1] + b',"claims":{' + b",".join(parts) + b"}}"

    def record(self, checkpoint: Checkpoint, uid: str) -> None:
        """Make claim ``uid``'s record in ``checkpoint`` (or its absence) durable
        as the whole checkpoint's save would: one journal entry, or a
        compaction (:meth:`save`) when one is due."""
        if self._entries >= max(len(checkpoint.claims), COMPACT_FROM):
            self.save(checkpoint)
            return
        record = checkpoint.claims.get(uid)
        data = None
        if record is not None:
            data = record.model_dump_json().encode()
            if record.state is ClaimState.PREPARE_COMPLETED:  # never changed again (encode)
                self._encoded[uid] = (record, json.dumps(uid).encode() + b":" + data)
        entry = journal_entry(self.boot_id, uid, data)
        st = None
        try:
            if self._appender is not None:
                self._appender.append(entry)
            else:
                st = journal_append(self.journal, entry)
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint journal {self.journal}: {exc}") from exc
        self._entries += 1
        if st is not None:
            known = self._seen[0] if self._seen is not None else _stat_identity(self.path)
            self._seen = (known, (st.st_ino, st.st_size, st.st_mtime_ns))
        self._current = checkpoint

    def compact(self, checkpoint: Checkpoint) -> bool:
        """Write the whole file if the journal holds entries (True if it did)."""
        if self._entries == 0:
            return False
        self.save(checkpoint)
        return True

    def save(self, checkpoint: Checkpoint) -> None:
        """Write the whole checkpoint (format 1) and remove the journal: the
        file is written first, so a crash in between leaves a journal that
        replays to what the file holds."""
        data = self.encode(checkpoint)
        try:
            write_atomic(self.path, data, mode=0o600, keep_spare=True)
            if self._entries:
                if self._appender is not None:
                    self._appender.close()  # appends after this create it anew
                remove_file(self.journal)
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {exc}") from exc
        if self.shared:
            # The journal as this store last saw it (read or written), or gone.
            journal = None if self._entries or self._seen is None else self._seen[1]
            self._seen = (_stat_identity(self.path), journal)
        self._entries = 0
        self._current = checkpoint


_Stat = tuple[int, int, int] | None  # inode, size, mtime of a file; None: missing
_Identity = tuple[_Stat, _Stat]  # the file's and the journal's


def _stat_identity(path: Path) -> _Stat:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise CheckpointError(f"cannot read the node's boot id from {path}: {exc}") from exc
