"""A MIG-capable GPU as one counter set and one device per (profile, placement).

Counters of a GPU's set (``gpu-<n>-mig``): ``mem0``..``mem7``, one per
memory slot with value 1, so two devices whose placements overlap can never
both be allocated; ``compute`` with the GPU's 7 compute slices; ``media``
with value 1, consumed by the profiles that own the media engines (``+me``
and ``7g``), so at most one of them exists. The full GPU consumes all of it.
Ten counters, well under the limit of 32 per set.

Device names are ``gpu-<n>-mig-<profile>-<start>`` with the profile's
dots and plus made DNS-safe (``gpu-0-mig-1g-10gb-me-0``): named after their
GPU's name (local GPUs first, ``driver.gpu.discovery``), stable for a given
profile table, and at most ~30 characters.

Lean devices (issue 26: a 4 x H100 node's MIG pool was 88 kB, half of it
attributes every placement repeats). A placement publishes only what a
DeviceClass, a claim's CEL, ``matchAttribute`` or ``kubectl patchbay``
reads: ``profile``, ``memorySlots``, ``computeSlices``, ``mediaEngines``,
``attachment``, ``type`` and the standard ``pcieRoot`` and ``numaNode``;
capacity ``memory``. Its GPU and start are in its counters (the set
``gpu-<n>-mig``, the slots ``mem<n>``), its identity in ``local_id``,
its parent GPU in the unpublished ``Device.parent``. Dropped (docs/scale.md
lists them for users' CEL): ``parentUUID``, ``parentIndex``,
``parentMinor``, ``placementStart``, ``pciBusID``, ``productName``,
``architecture`` and the capacities ``multiprocessors`` and
``computeSlices``. A media-extended profile (``+me``: the GPU has one set
of media engines, and the ``media`` counter lets one instance hold it) is
offered at its lowest start only (:func:`offered_starts`; the evidence is
in docs/scale.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from driver.devices.model import (
    ATTACHMENT,
    NUMA_NODE,
    PCIE_ROOT,
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
)
from driver.nvml.backend import MigProfile

MEMORY_SLOTS = 8
COMPUTE_SLICES = 7
KIND = "mig"
# Parent attributes every MIG device repeats (matchAttribute with NICs, CEL).
_INHERITED = (ATTACHMENT, PCIE_ROOT, NUMA_NODE)
_SET_NAME = re.compile(r"^gpu-(\d+)-mig$")


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-mig"


def slot_counter(slot: int) -> str:
    return f"mem{slot}"


def counter_set(gpu_index: int) -> CounterSet:
    counters = [(slot_counter(s), "1") for s in range(MEMORY_SLOTS)]
    counters += [("compute", str(COMPUTE_SLICES)), ("media", "1")]
    return CounterSet(counter_set_name(gpu_index), tuple(counters))


def full_gpu(device: Device, gpu_index: int) -> Device:
    """The full-GPU device consuming every counter of its GPU's set."""
    whole = counter_set(gpu_index)
    return replace(device, consumes_counters=(CounterConsumption(whole.name, whole.counters),))


def profile_slug(name: str) -> str:
    """ "1g.10gb+me" -> "1g-10gb-me"."""
    return name.replace(".", "-").replace("+", "-").lower()


def device_name(gpu_index: int, profile: MigProfile, start: int) -> str:
    return f"gpu-{gpu_index}-mig-{profile_slug(profile.name)}-{start}"


def local_id(gpu_uuid: str, profile_id: int, start: int) -> str:
    """The placement's identity: the preparer refuses two claims on one id."""
    return f"{gpu_uuid}:{profile_id}:{start}"


def parse_local_id(value: str) -> tuple[str, int, int]:
    uuid, profile_id, start = value.rsplit(":", 2)
    return uuid, int(profile_id), int(start)


def consumption(gpu_index: int, profile: MigProfile, start: int) -> CounterConsumption:
    counters = [(slot_counter(s), "1") for s in range(start, start + profile.memory_slots)]
    counters.append(("compute", str(profile.compute_slices)))
    if profile.media_engines:
        counters.append(("media", "1"))
    return CounterConsumption(counter_set_name(gpu_index), tuple(counters))


def mig_device(parent: Device, gpu_index: int, profile: MigProfile, start: int) -> Device:
    attrs: dict[str, AttributeValue] = {
        "profile": profile.name,
        "memorySlots": profile.memory_slots,
        "computeSlices": profile.compute_slices,
        "mediaEngines": profile.media_engines,
    }
    for name in _INHERITED:
        if name in parent.attributes:
            attrs[name] = parent.attributes[name]
    return Device(
        name=device_name(gpu_index, profile, start),
        kind=KIND,
        local_id=local_id(parent.local_id, profile.profile_id, start),
        attributes=attrs,
        capacity={"memory": f"{profile.memory_mib}Mi"},
        consumes_counters=(consumption(gpu_index, profile, start),),
        parent=parent.local_id,
    )


def offered_starts(profile: MigProfile) -> list[int]:
    """The starts a profile is offered at: all of its placements, but a
    media-extended one (``+me``, not the whole GPU) at its lowest only: the
    GPU holds one instance with the media engines at a time, and with ``+me``
    requests in the MIG bench's mix the lowest start alone served as much
    compute as all seven (docs/scale.md)."""
    starts = [start for start, _ in profile.placements]
    if starts and profile.media_engines and profile.memory_slots < MEMORY_SLOTS:
        return [min(starts)]
    return starts


def mig_devices(parent: Device, gpu_index: int, profiles: Sequence[MigProfile]) -> list[Device]:
    """One device per offered (profile, placement) of ``profiles``, in table order."""
    return [
        mig_device(parent, gpu_index, profile, start)
        for profile in profiles
        for start in offered_starts(profile)
    ]


def placement_of(device: Device) -> tuple[int, int]:
    """A MIG device's (GPU index, start), from its counter set and identity."""
    for use in device.consumes_counters:
        if found := _SET_NAME.match(use.counter_set):
            return int(found.group(1)), parse_local_id(device.local_id)[2]
    raise ValueError(f"{device.name} consumes no MIG counter set")
