"""The metrics of patchbay's processes, on prometheus-client.

Why here: one module owns every metric object (name, help, labels, buckets),
call sites import the object they update, and docs/metrics.md lists the same
names. Each process exports its own registry (``PLUGIN`` or ``CONTROLLER``,
not the library's global default, so tests and other libraries never add to
it): a metric both processes update (slice writes) is registered in both.
prometheus-client costs about 1.5 MB resident and 30 ms of import (README,
Figures); it brings histograms, the exposition format and its parser, which
our own registry lacked.

Gauges that describe state the process already holds (devices, the fabric
inventory) are :class:`Sampled`: read from a callable at scrape time, so they
can never drift from that state. Scrapes run on the process's asyncio loop,
as does the state they read.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

# No *_created series: nobody reads them. (The library leaves this function unannotated.)
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

PLUGIN = CollectorRegistry(auto_describe=True)
CONTROLLER = CollectorRegistry(auto_describe=True)
BOTH = (PLUGIN, CONTROLLER)
for _registry in BOTH:
    ProcessCollector(registry=_registry)  # process_resident_memory_bytes, CPU, fds

# Calls on the prepare path take 0.5-10 ms; a stuck NVML or apiserver call seconds.
CLAIM_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# A fabric attach takes from a second to minutes (the attach timeout is 120 s).
FABRIC_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def _registered(collector: Collector, registries: Sequence[CollectorRegistry]) -> None:
    for registry in registries:
        registry.register(collector)


def counter(name: str, doc: str, labels: Sequence[str], *registries: CollectorRegistry) -> Counter:
    c = Counter(name, doc, labels, registry=None)
    _registered(c, registries)
    return c


def gauge(name: str, doc: str, labels: Sequence[str], *registries: CollectorRegistry) -> Gauge:
    g = Gauge(name, doc, labels, registry=None)
    _registered(g, registries)
    return g


def histogram(
    name: str, doc: str, buckets: Sequence[float], labels: Sequence[str],
    *registries: CollectorRegistry,
) -> Histogram:  # fmt: skip
    h = Histogram(name, doc, labels, registry=None, buckets=buckets)
    _registered(h, registries)
    return h


Samples = Iterable[tuple[Sequence[str], float]]
_Owner = TypeVar("_Owner")


class Sampled(Collector):
    """A gauge family read at scrape time from its sources (label values, value).

    A source is an object and how to read it (:meth:`add_source`), held
    weakly: each object that lives contributes (samples of equal labels are
    summed), one that is gone drops out, and a second instance (a restarted
    reconciler, a test's) adds to the first instead of replacing it."""

    def __init__(
        self, name: str, doc: str, labels: Sequence[str], *registries: CollectorRegistry
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = tuple(labels)
        self._sources: list[tuple[weakref.ref[Any], Callable[[Any], Samples]]] = []
        _registered(self, registries)

    def add_source(self, owner: _Owner, read: Callable[[_Owner], Samples]) -> None:
        """Read ``read(owner)`` at each scrape while ``owner`` lives (``read``
        must not hold ``owner`` itself: an unbound method, a plain function)."""
        self._sources.append((weakref.ref(owner), read))

    def samples(self) -> dict[tuple[str, ...], float]:
        """Every live source's samples, summed by label values."""
        out: dict[tuple[str, ...], float] = {}
        live = []
        for ref, read in self._sources:
            owner = ref()
            if owner is None:
                continue
            live.append((ref, read))
            for values, value in read(owner):
                key = tuple(values)
                out[key] = out.get(key, 0.0) + value
        self._sources = live
        return out

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.doc, labels=self.labels)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, value in self.samples().items():
            family.add_metric(list(values), value)
        yield family


def series_names(registry: CollectorRegistry) -> set[str]:
    """Every series name ``registry`` exports, as a query names it
    (``x_total`` for a counter, ``x_bucket``/``x_sum``/``x_count`` for a histogram)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


# -- both processes: the slice publisher (driver.slices.publisher) -----------
SLICE_WRITES = counter(
    "patchbay_resourceslice_writes_total",
    "ResourceSlice create/update/delete calls by operation", ("op",), *BOTH,
)  # fmt: skip
SLICE_FAILURES = counter(
    "patchbay_resourceslice_publish_failures_total",
    "Pool publications that failed: api (an API call failed, retried with backoff) or"
    " diverged (the stored slices differ again after rewrites of the same pool)",
    ("reason",), *BOTH,
)  # fmt: skip

# -- the node plugin ----------------------------------------------------------
PREPARE_CALLS = counter(
    "patchbay_prepare_claims_total", "Claims handled by NodePrepareResources, by result",
    ("result",), PLUGIN,
)  # fmt: skip
UNPREPARE_CALLS = counter(
    "patchbay_unprepare_claims_total", "Claims handled by NodeUnprepareResources, by result",
    ("result",), PLUGIN,
)  # fmt: skip
PREPARE_SECONDS = histogram(
    "patchbay_prepare_duration_seconds",
    "Seconds the driver spent on one NodePrepareResources call (claim lock, reads, devices,"
    " checkpoint, CDI)", CLAIM_BUCKETS, (), PLUGIN,
)  # fmt: skip
UNPREPARE_SECONDS = histogram(
    "patchbay_unprepare_duration_seconds",
    "Seconds the driver spent on one NodeUnprepareResources call", CLAIM_BUCKETS, (), PLUGIN,
)  # fmt: skip
PREPARED_CLAIMS = gauge(
    "patchbay_prepared_claims", "Claims currently prepared on this node", (), PLUGIN
)
DEVICES = Sampled(
    "patchbay_devices",
    "Devices this node's plugin knows, by attachment (local, fabric), type (gpu, mig, vf) and"
    " health (healthy, unhealthy)", ("attachment", "type", "health"), PLUGIN,
)  # fmt: skip
DEVICES_TAINTED = Sampled(
    "patchbay_devices_tainted", "Devices published with a taint (an unhealthy GPU's NoSchedule)",
    ("attachment", "type"), PLUGIN,
)  # fmt: skip
DEVICES_PREPARED = Sampled(
    "patchbay_devices_prepared",
    "Devices held by a prepared claim on this node (free = patchbay_devices - this)",
    ("attachment", "type"), PLUGIN,
)  # fmt: skip
HOTPLUG_EVENTS = counter(
    "patchbay_hotplug_events_total", "PCI hot-plug events that triggered a rescan, by action",
    ("action",), PLUGIN,
)  # fmt: skip
NVML_ERRORS = counter(
    "patchbay_nvml_errors_total",
    "NVML failures the driver saw (an NvmlError out of a backend call), by call and NVML code",
    ("call", "code"), PLUGIN,
)  # fmt: skip
GPUS_UNHEALTHY = Sampled(
    "patchbay_gpus_unhealthy",
    "GPUs of this node with a health record, by failure class (reset, reboot, replace) and"
    " recovery phase (tainted, resetting, checking, failed)", ("class", "phase"), PLUGIN,
)  # fmt: skip
GPU_FAILURES = counter(
    "patchbay_gpu_failures_total",
    "GPUs turned unhealthy, by failure class (reset, reboot, replace: a GPU to replace)",
    ("class",), PLUGIN,
)  # fmt: skip
GPU_RESETS = counter(
    "patchbay_gpu_resets_total",
    "GPU resets by result: tried (nvidia-smi ran), succeeded, failed, refused (a process held"
    " the GPU; retried)", ("result",), PLUGIN,
)  # fmt: skip
GPU_RECOVERY_SECONDS = histogram(
    "patchbay_gpu_recovery_seconds",
    "Seconds from a GPU's failure to its capacity back (published healthy after a passing"
    " check)", (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0), (), PLUGIN,
)  # fmt: skip
PLUGIN_REGISTERED = gauge(
    "patchbay_plugin_registered",
    "1 while the kubelet reports this plugin registered (NotifyRegistrationStatus), else 0",
    (), PLUGIN,
)  # fmt: skip
DEVICE_UTILIZATION = Sampled(
    "patchbay_device_utilization_percent",
    "Last utilization reading (NVML) of each device a prepared claim holds: a whole GPU's rate,"
    " a MIG device's SM utilization since the previous reading; a share reads its GPU's",
    ("namespace", "claim", "pool", "device"), PLUGIN,
)  # fmt: skip
DEVICE_IDLE_SECONDS = Sampled(
    "patchbay_device_idle_seconds",
    "Seconds each held device has stayed below the idle threshold (0 when it is not; Idle=True"
    " on its claim from the idle window on)", ("namespace", "claim", "pool", "device"), PLUGIN,
)  # fmt: skip

# -- the controller -------------------------------------------------------------
FABRIC_OPS = counter(
    "patchbay_fabric_operations_total", "Fabric attach/detach operations by result",
    ("op", "result"), CONTROLLER,
)  # fmt: skip
FABRIC_SECONDS = histogram(
    "patchbay_fabric_operation_duration_seconds",
    "Seconds from the start of an attach (until the node sees the device) or detach to its end",
    FABRIC_BUCKETS, ("op", "result"), CONTROLLER,
)  # fmt: skip
FABRIC_UNREADABLE = counter(
    "patchbay_fabric_unreadable_resources_total",
    "Broken fabric resources by cause: skipped by a read (the rest is kept) or met by an"
    " attach (waited out)",
    ("cause",), CONTROLLER,
)  # fmt: skip
FABRIC_IN_FLIGHT = gauge(
    "patchbay_fabric_operations_in_flight",
    "Attach/detach operations running or waiting (the controller's queue)", ("op",), CONTROLLER,
)  # fmt: skip
FABRIC_DEVICES = Sampled(
    "patchbay_fabric_devices",
    "Fabric devices by type (gpu, nic) and state (free, attached, held after a failed attach,"
    " unavailable: another tenant's or critical)", ("type", "state"), CONTROLLER,
)  # fmt: skip
FABRIC_POOL_DEVICES = gauge(
    "patchbay_fabric_pool_devices",
    "Devices in the published fabric pool (one per free device and reachable node/adapter; "
    "on a count fabric, one slot per free device of a model and reachable node/adapter)",
    (), CONTROLLER,
)  # fmt: skip
FABRIC_SPARES = Sampled(
    "patchbay_fabric_spares",
    "Warm spares (fabric devices attached in advance that no claim holds) by state: attaching,"
    " ready (published without binding conditions), attached (its node does not report it yet)",
    ("state",), CONTROLLER,
)  # fmt: skip
FABRIC_SPARE_ALLOCATIONS = counter(
    "patchbay_fabric_spare_allocations_total",
    "Fabric allocations by result: hit (a warm spare, no attach to wait for) or miss (an attach"
    " to wait for, counted while a spare policy is set)", ("result",), CONTROLLER,
)  # fmt: skip
FABRIC_REPLACEMENTS = counter(
    "patchbay_fabric_replacements_total",
    "Warm spare GPUs attached to a node to replace a GPU it lost (spares_replace_failed)",
    (), CONTROLLER,
)  # fmt: skip
FABRIC_UNHEALTHY = Sampled(
    "patchbay_fabric_devices_unhealthy",
    "Fabric devices a node reported failed, by state: attached (tainted with the node's effect,"
    " detached once no claim holds it) or held (detached, held out of the pool)",
    ("state",), CONTROLLER,
)  # fmt: skip
CONTROLLER_LEADER = gauge(
    "patchbay_controller_leader", "1 while this controller replica holds the leader Lease",
    (), CONTROLLER,
)  # fmt: skip
LEASES = Sampled(
    "patchbay_device_leases",
    "Claims under a device lease (docs/leases.md) by state: active, expiring (warned), expired"
    " (its pods being evicted), reclaimed (idle: its pods being evicted), audited (ended under"
    " policies in audit mode: nothing evicted)", ("state",), CONTROLLER,
)  # fmt: skip
LEASE_SECONDS_TO_EXPIRY = Sampled(
    "patchbay_device_lease_seconds_to_expiry",
    "Seconds until a running device lease (active or expiring) ends, per claim: below 0 while"
    " its expiry waits for the controller (docs/leases.md)", ("claim_namespace", "claim"),
    CONTROLLER,
)  # fmt: skip
LEASE_EVICTIONS = counter(
    "patchbay_device_lease_evictions_total",
    "Pods evicted through the Eviction API to take their claim's devices back, by cause:"
    " expiry (the device lease ended) or idle (the devices idle under a Reclaim policy)",
    ("cause",), CONTROLLER,
)  # fmt: skip
LEASE_EVICTIONS_BLOCKED = counter(
    "patchbay_device_lease_evictions_blocked_total",
    "Evictions of an expired or reclaimed lease's pods that a PodDisruptionBudget refused (each"
    " is retried)", (), CONTROLLER,
)  # fmt: skip
LEASE_WOULD_EVICT = counter(
    "patchbay_device_lease_would_evict_total",
    "Audit mode: pods an expiry or idle reclaim would have evicted under policies that only"
    " report (spec.audit), by cause (expiry, idle)", ("cause",), CONTROLLER,
)  # fmt: skip
ALLOCATED_DEVICE_SECONDS = counter(
    "patchbay_device_seconds_allocated_total",
    "Device-seconds allocated: each device of ours a claim holds adds a second per second, by"
    " the claim's namespace, holder (the lease's) and device class",
    ("claim_namespace", "holder", "class"), CONTROLLER,
)  # fmt: skip
IDLE_DEVICE_SECONDS = counter(
    "patchbay_device_seconds_idle_total",
    "Device-seconds idle: the part of patchbay_device_seconds_allocated_total during which the"
    " device's node reported it Idle=True", ("claim_namespace", "holder", "class"), CONTROLLER,
)  # fmt: skip
