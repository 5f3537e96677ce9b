"""What each device type does at prepare and unprepare time.

A handler exists per device type (``gpu``, ``mig``, ``vf``). The claim
preparer calls a handler that may block (NVML, sysfs, a lock it shares with
scans: ``blocking``) from a worker thread, one that only computes CDI edits
on the event loop. Handlers must be idempotent: unprepare may run twice, and prepare
may run again after a crash left a half-done preparation behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from driver.cdi import ContainerEdits
from driver.config.opaque import DeviceConfig
from driver.devices.model import Device


@dataclass(frozen=True)
class Preparation:
    """The container edits for one prepared device and how to undo it.

    ``claim_lists`` holds (variable, item) pairs of comma-separated list
    variables that speak for the whole claim, such as
    ``NVIDIA_VISIBLE_DEVICES``. A container receives the union of its CDI
    devices' edits, a later device's variable overriding an earlier one's, so
    a per-device value would leave only the last GPU visible. The preparer
    joins the items of every device of the claim (device order, no repeats)
    and sets each variable once, in the claim spec's own edits, which come
    with any device of the claim.

    ``indexed_env`` holds (variable, value) pairs numbered by this device's
    position in the claim's first list of ``claim_lists`` (the index the
    container sees the GPU at): ``("CUDA_DEVICE_SM_LIMIT", "30")`` on the
    claim's second GPU becomes ``CUDA_DEVICE_SM_LIMIT_1=30``, in the claim
    spec's own edits.
    """

    edits: ContainerEdits
    undo: Mapping[str, Any] = field(default_factory=dict)
    claim_lists: tuple[tuple[str, str], ...] = ()
    indexed_env: tuple[tuple[str, str], ...] = ()
    # The device's NetworkDeviceData (interfaceName, hardwareAddress), API
    # shape, for its device metadata file (driver.claims.metadata); None: none.
    network: Mapping[str, Any] | None = None


class DeviceHandler(Protocol):
    kind: str
    # True when prepare changes the device itself (not only CDI edits), so
    # the claim must be checkpointed as PrepareStarted before it runs.
    has_side_effects: bool
    # True when prepare or unprepare may block whatever is asked (NVML,
    # sysfs, a lock shared with scans): the preparer then runs the claim in a
    # worker thread. A handler that blocks only for some claims says which
    # (blocks_prepare, blocks_unprepare below).
    blocking: bool

    def plan_undo(self, device: Device, config: DeviceConfig | None = None) -> dict[str, Any]:
        """What unprepare needs, known before any side effect happens (it is
        checkpointed first, so a crash mid-prepare can still be undone);
        ``config``: the device's effective config (what it will be asked)."""
        ...

    def prepare(
        self, device: Device, claim_uid: str, config: DeviceConfig | None
    ) -> Preparation: ...

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None: ...

    def common_edits(self) -> ContainerEdits | None:
        """Edits every container with a device of this type needs (control nodes)."""
        ...


def blocks_prepare(handler: DeviceHandler, configs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether preparing a claim with these raw config parameters may block:
    always for a ``blocking`` handler, and for one whose
    ``blocking_for_config(parameters)`` says so for one of them (a GPU bound
    to vfio-pci, only when a config asks: ``driver.gpu.prepare``)."""
    if handler.blocking:
        return True
    decide = getattr(handler, "blocking_for_config", None)
    return callable(decide) and any(decide(c) for c in configs)


def blocks_unprepare(handler: DeviceHandler, undo: Mapping[str, Any]) -> bool:
    """Whether unpreparing a device with this undo record may block (as
    :func:`blocks_prepare`, from ``blocking_for_undo(undo)``)."""
    if handler.blocking:
        return True
    decide = getattr(handler, "blocking_for_undo", None)
    return callable(decide) and bool(decide(undo))


def changes_device(handler: DeviceHandler, config: DeviceConfig | None) -> bool:
    """Whether preparing a device with ``config`` changes the device itself, so
    the claim must be checkpointed first: always for a handler with
    ``has_side_effects``, and for one whose ``changes_device(config)`` says so
    (a GPU bound to vfio-pci only when its config asks: ``driver.gpu.prepare``).
    """
    if handler.has_side_effects:
        return True
    decide = getattr(handler, "changes_device", None)
    return bool(decide(config)) if callable(decide) else False


class ClaimSharing(Protocol):
    """Work on a claim's devices together (GPU sharing: ``driver.gpu.sharing``).

    Planned with the devices (its undo data joins each device record's, so it
    is checkpointed before anything happens), applied after every device's
    handler, undone before them. It may block (NVML, subprocesses): a claim
    it is ``involved`` in is prepared and unprepared in a worker thread.
    ``apply`` is idempotent; start-up runs it again for prepared claims.
    """

    def plan(
        self, claim_uid: str, devices: Sequence[tuple[Device, DeviceConfig | None]]
    ) -> list[dict[str, Any]]:
        """Per device, the undo data to add to its record ({}: nothing to do)."""
        ...

    def involved(self, undos: Sequence[Mapping[str, Any]]) -> bool: ...
    def apply(
        self, claim_uid: str, undos: Sequence[Mapping[str, Any]]
    ) -> ContainerEdits | None: ...
    def undo(self, claim_uid: str, undos: Sequence[Mapping[str, Any]]) -> None: ...


class Inventory(Protocol):
    """The devices this node can prepare, by pool and device name."""

    def pools(self) -> frozenset[str]: ...

    def lookup(self, pool: str, device: str) -> Device | None: ...
