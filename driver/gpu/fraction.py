"""Fractional GPUs: a shareable GPU published once more, as a device many
claims share through consumable capacity (``DRAConsumableCapacity``).

The operator marks GPUs shareable (``--shared-gpus``: ``all`` or NVML
indices/UUIDs) and sets the memory step (``--shared-gpu-memory-step``, MiB).
For each such GPU the pool gets ``gpu-<n>-shared`` (type ``shared-gpu``)
with ``allowMultipleAllocations: true``, the parent's attributes and two
capacities the scheduler accounts for:

- ``memory``: the GPU's memory; a request is rounded up to a multiple of the
  step (``validRange`` min = step = the setting); a claim that names no
  memory consumes all of it that the step can express (no silent overcommit);
- ``cores``: percent of the SMs, 0..100 in steps of 1; a claim that names no
  cores consumes 0, i.e. no SM limit: it time-shares the whole GPU.

One mode per GPU: the shared device consumes its GPU's whole counter set, the
same one the full GPU (and, with dynamic MIG, every partition) consumes. The
1.37 allocator charges an allow-multiple device's counters once, for its first
share, so while any sharer holds the GPU neither the full GPU nor a partition
fits, and the reverse (docs/sharing.md, "One mode per GPU"). A GPU without
MIG gets a one-counter set of its own (``gpu-<n>-whole``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from driver.devices import quantity
from driver.devices.kind import Discovery
from driver.devices.model import CounterConsumption, CounterSet, Device, RequestPolicy
from driver.errors import ConfigError
from driver.gpu.discovery import gpu_number

log = logging.getLogger(__name__)

KIND = "shared-gpu"
MEMORY = "memory"
CORES = "cores"
MIB = 1024 * 1024


def _items(raw: str) -> frozenset[str]:
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


@dataclass(frozen=True)
class SharePolicy:
    """Which GPUs are shareable and the memory step; owns the settings' meaning."""

    gpus: frozenset[str]  # empty: none; {"all"}: every full GPU of the node pool
    memory_step_mib: int = 1024

    @classmethod
    def parse(cls, gpus: str, memory_step_mib: int) -> SharePolicy:
        chosen = _items(gpus)
        if "all" in chosen and len(chosen) > 1:
            raise ConfigError(f"shared-gpus: 'all' cannot be combined with a list: {gpus!r}")
        if memory_step_mib < 1:
            raise ConfigError(f"shared-gpu-memory-step: must be at least 1 MiB: {memory_step_mib}")
        return cls(chosen, memory_step_mib)

    @property
    def enabled(self) -> bool:
        return bool(self.gpus)

    def selects(self, gpu: Device) -> bool:
        ids = {gpu.local_id, str(gpu.attributes.get("index"))}
        return "all" in self.gpus or bool(ids & self.gpus)


def whole_set(number: int) -> CounterSet:
    """The one-counter set of full GPU ``gpu-<number>``."""
    return CounterSet(f"gpu-{number}-whole", (("gpu", "1"),))


def memory_mib(device: Device) -> int:
    """The device's ``memory`` capacity in whole MiB (0 when it has none)."""
    raw = device.capacity.get(MEMORY)
    return int(quantity.parse(raw)[0] // MIB) if raw else 0


def shared_device(gpu: Device, step_mib: int) -> Device | None:
    """The shareable twin of full GPU ``gpu`` (consuming what ``gpu`` consumes),
    or None when its memory is too small for two steps (the apiserver's rule)."""
    total = memory_mib(gpu)
    if total < 2 * step_mib:
        log.warning(
            "GPU %s: %d MiB is under two %d MiB steps, not shared", gpu.name, total, step_mib
        )
        return None
    usable = total - (total - step_mib) % step_mib  # min + n * step, at most the total
    step = f"{step_mib}Mi"
    return Device(
        name=f"{gpu.name}-shared",
        kind=KIND,
        local_id=gpu.local_id,
        attributes=dict(gpu.attributes),
        capacity={MEMORY: f"{total}Mi", CORES: "100"},
        consumes_counters=gpu.consumes_counters,
        allow_multiple_allocations=True,
        request_policies=(
            (CORES, RequestPolicy(default="0", min="0", step="1", max="100")),
            (MEMORY, RequestPolicy(default=f"{usable}Mi", min=step, step=step)),
        ),
    )


def with_shared(found: Discovery, policy: SharePolicy) -> Discovery:
    """``found`` plus a shared device per selected full GPU, after all others
    (first fit then packs sharers onto the lowest GPU that has room)."""
    devices: list[Device] = []
    shared: list[Device] = []
    sets = list(found.counter_sets)
    for device in found.devices:
        if device.kind != "gpu" or not policy.selects(device):
            devices.append(device)
            continue
        if not device.consumes_counters:  # no MIG set: a counter of its own
            whole = whole_set(gpu_number(device))
            sets.append(whole)
            device = replace(
                device, consumes_counters=(CounterConsumption(whole.name, whole.counters),)
            )
        devices.append(device)
        twin = shared_device(device, policy.memory_step_mib)
        if twin is not None:
            shared.append(twin)
    return Discovery(devices=tuple(devices + shared), counter_sets=tuple(sets))
