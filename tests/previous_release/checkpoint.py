"""FROZEN: driver/checkpoint.py as the last release before the checkpoint
journal had it (47729e1), verbatim below this note. Older builds read only
the checkpoint file (format 1); tests/unit/test_checkpoint_rollback.py runs
this reading code over what today's build writes. Never edit it to follow
today's code: it stands for the build a rollback runs.

The plugin's record of prepared claims, kept across restarts and upgrades.

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

The records are read in one place: :func:`holdings` turns them into typed
:class:`Holding` values (which claim holds which device, as a share, or
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
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from driver.atomicfile import remove_stale_temps, write_atomic
from driver.errors import CheckpointError

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1

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


class Holding(NamedTuple):
    """One device a recorded claim holds (or is preparing, or must undo).
    A named tuple: every prepare reads one per device on the node."""

    claim_uid: str
    kind: str
    local_id: str
    pool: str
    device: str
    share_id: str | None  # one share of a shareable device
    newer: bool  # the record has what only a newer build understands


def holdings(checkpoint: Checkpoint, kinds: Collection[str]) -> list[Holding]:
    """Every device the checkpoint's claims hold; admin-access views hold
    nothing. ``kinds``: the device kinds this build has handlers for."""
    out: list[Holding] = []
    for claim in checkpoint.claims.values():
        # ClaimRecord.not_understood, without its message
        newer = not isinstance(claim.state, ClaimState) or any(
            d.kind not in kinds for d in claim.devices
        )
        out += [
            Holding(claim.uid, d.kind, d.local_id, d.pool_name, d.device_name, d.share_id, newer)
            for d in claim.devices
            if not d.admin_access
        ]
    return out


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
    """Loads and saves the checkpoint file; one owner per process."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.moved_aside: Path | None = None
        self._seen: tuple[int, int, int] | None = None  # the file we last read or wrote
        self._current: Checkpoint | None = None
        self._followers: list[Callable[[Checkpoint], None]] = []
        self._encoded: dict[str, tuple[ClaimRecord, bytes]] = {}  # completed records' JSON

    def follow(self, follower: Callable[[Checkpoint], None]) -> None:
        """Call ``follower`` with every checkpoint read from disk from now on
        (the first read, and each re-read of a file another process wrote)."""
        self._followers.append(follower)

    def current(self) -> Checkpoint:
        """The checkpoint this process last read or saved; read on first use."""
        return self._current if self._current is not None else self.load()

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def changed(self) -> bool:
        """Whether the file is another than the one this store last read or
        wrote (inode, size, mtime): only then must a shared checkpoint be
        read again. Every save replaces the file, so its inode changes."""
        return self._identity() != self._seen

    def load(self) -> Checkpoint:
        """The stored checkpoint, an empty one if there is none, read anew
        (and handed to every follower).

        A corrupt file is moved aside (its new name is logged) and an empty
        checkpoint returned; the caller learns of it from the log and the
        ``moved_aside`` attribute.
        """
        checkpoint = self._read()
        self._current = checkpoint
        for follower in self._followers:
            follower(checkpoint)
        return checkpoint

    def _read(self) -> Checkpoint:
        self.moved_aside = None
        self._seen = self._identity()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._seen = None
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
            self._seen = None
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

    def save(self, checkpoint: Checkpoint) -> None:
        data = self.encode(checkpoint)
        try:
            write_atomic(self.path, data, mode=0o600, keep_spare=True)
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {exc}") from exc
        self._seen = self._identity()
        self._current = checkpoint


def read_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise CheckpointError(f"cannot read the node's boot id from {path}: {exc}") from exc
