"""Wire the node plugin together and run it.

Concurrency model: one asyncio loop. It runs the gRPC servers (registration,
DRA v1/v1beta1, health), the slice publisher (list+watch and reconcile), idle
detection (``driver.idle.reporter``) and the hot-plug watcher under one
TaskGroup; if any of them fails the group
fails and the process exits non-zero (the DaemonSet restarts it) rather than
limp on half-alive. Blocking NVML and sysfs work runs in worker threads.
SIGTERM stops the servers gracefully, then the rest of the group.

A host without usable NVML (no driver library, driver not loaded) is not a
reason to exit: the GPU family scans through a gate (``driver.node.nvml_gate``)
that yields no GPUs and says why (log, ``/healthz``), a task retries NVML with
backoff, and the health stream is advertised (re-registering) once it works.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from driver import DRIVER_NAME
from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore, read_boot_id
from driver.claims.lock import ClaimLock
from driver.claims.metadata_files import MetadataFiles
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.kind import DeviceType, all_handlers, scan_settled
from driver.devices.model import CounterSet, drawn_on
from driver.errors import Stopped
from driver.fabric_devices.naming import NODE_ANNOTATION
from driver.fabric_devices.node import FabricNodeView, gpu_failures, held_gpus
from driver.fabric_devices.usage import FabricUsage, nvml_probe
from driver.gpu.kind import GpuType
from driver.httpendpoint import serve_http
from driver.idle.reporter import IdleReporter, export_idle_metrics
from driver.kube.client import KubeClient
from driver.kube.events import EventRecorder, ObjectEvents, ObjectRef
from driver.kube.node_annotation import NodeAnnotation
from driver.kube.objects import ApiClaimReader, owner_reference, wait_for_node
from driver.logconfig import set_process_fields
from driver.metrics import PLUGIN, PLUGIN_REGISTERED
from driver.node import hotplug
from driver.node.nvml_gate import NvmlGate, retry_while_unavailable
from driver.slices.build import PoolSpec, slice_name_prefix
from driver.slices.order import node_order
from driver.slices.publisher import SlicePublisher
from plugin.device_metrics import DeviceCounts, export_device_counts
from plugin.device_types import (
    arrivals_of,
    fabric_view,
    gpu_sharing,
    idle_reporter,
    xid_watcher,
)
from plugin.gpu_health import HealthHistory, gpu_recovery, health_monitor
from plugin.grpc_server import PluginServers
from plugin.settings import PluginSettings
from plugin.sockets import SocketPaths, checkpoint_file, socket_paths

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "patchbay.dev/plugin"  # our Events' source (docs/events.md)


def checkpoint_store(settings: PluginSettings) -> CheckpointStore:
    """The process's one checkpoint store (``driver.checkpoint``): the claim
    preparer and dynamic MIG (``plugin.device_types``) get this one."""
    boot_id = read_boot_id(settings.boot_id_file)
    path = checkpoint_file(settings.plugin_dir)
    return CheckpointStore(path, boot_id, shared=settings.rolling_update)


class NodePlugin:
    """The running plugin: discovery, publishing, kubelet servers."""

    def __init__(
        self,
        settings: PluginSettings,
        api: KubeClient,
        device_types: Sequence[DeviceType],
        store: CheckpointStore | None = None,
    ) -> None:
        self.settings = settings
        # The store the device families got (None: made when claims are served).
        self.store = store
        self.api = api
        self.device_types = list(device_types)
        # What a scan runs: the GPU family behind its NVML gate.
        self.scanned: list[DeviceType] = [
            NvmlGate(t, required=settings.nvml_required) if isinstance(t, GpuType) else t
            for t in self.device_types
        ]
        self.gates = [t for t in self.scanned if isinstance(t, NvmlGate)]
        self.servers: PluginServers | None = None
        self.inventory = NodeInventory()
        self._scan_lock = asyncio.Lock()
        self.pool_name = settings.node_name
        self.publisher = SlicePublisher(
            api,
            {"fieldSelector": f"spec.nodeName={settings.node_name},spec.driver={DRIVER_NAME}"},
            pool_name=self.pool_name,
        )
        self.owner: dict[str, Any] | None = None
        self.preparer: ClaimPreparer | None = None
        self.idle: IdleReporter | None = None  # Idle conditions (driver.idle.reporter)
        self.health = health_monitor(settings, self.device_types)  # persisted (gpu-health.json)
        self.health_history = HealthHistory(settings, api, self.health)  # its Node annotation
        # Events on the Node (device health and recovery, devices or slices not published).
        self.recorder = EventRecorder(
            api, REPORTING_CONTROLLER, f"patchbay-plugin-{settings.node_name}"
        )
        self.health.on_change = self.health_changed
        self.health.leaving = self.detached_gpu
        self._fabric_gpus: set[str] = set()  # UUIDs ever seen behind a fabric adapter
        self._counter_sets: tuple[CounterSet, ...] = ()
        self._published = False
        self.xid = xid_watcher(self.device_types, self.health.report_xid)
        self._serving = False
        self._hotplug_ended = False
        self.fabric: FabricNodeView | None = fabric_view(settings)
        self.fabric_report = (
            NodeAnnotation(api, settings.node_name, NODE_ANNOTATION, "node fabric report")
            if self.fabric
            else None
        )
        # What NVML says of attached fabric GPUs no claim holds (busy report).
        self.fabric_usage: FabricUsage | None = None
        if self.fabric is not None:
            probe = nvml_probe(self.device_types)
            if probe is not None:
                self.fabric_usage = FabricUsage(probe)
                self.fabric_usage.on_change = self.report_fabric

    async def rescan(self) -> None:
        """Re-enumerate the node's devices and republish if anything changed."""
        async with self._scan_lock:
            found = await scan_settled(self.scanned)
        if self.servers is not None and self.nvml_reached():
            await self.servers.advertise_health()  # no-op once advertised
        devices = list(found.devices)
        came_or_went = False  # a fabric device: its GPU's health is watched from now on
        if self.fabric is not None and self.fabric_report is not None:
            # Fabric-attached GPUs are prepared from the fabric pool, never offered locally.
            devices, attached = await asyncio.to_thread(self.fabric.split, devices)
            came_or_went = self.inventory.replace_pool(self.settings.fabric_pool, attached)
            self._fabric_gpus |= {d.local_id for d in attached if d.kind == "gpu"}
            # A failed fabric GPU's record ends with its detach: attached again, it starts healthy.
            if failed := self.health.fabric_gpus():
                for uuid in await asyncio.to_thread(self.fabric.detached, failed, attached):
                    self.health.detached(uuid)
            self.report_fabric()
        changed = self.inventory.replace_pool(self.pool_name, devices)
        counter_sets = drawn_on(found.counter_sets, devices)  # none of a fabric GPU's
        if counter_sets != self._counter_sets:
            self._counter_sets = counter_sets
            changed = True
        if not changed and not came_or_went and self._published:
            return  # nothing to rebuild or diff: the publisher holds this pool already
        self.health.set_devices(
            {p: self.inventory.devices(p) for p in (self.pool_name, self.settings.fabric_pool)}
        )
        if self.xid is not None:
            self.xid.set_gpus(self.health.gpus())
        if self.owner is not None:
            self.publish()
        if changed:
            log.info("node pool now has %d devices", len(devices))

    def publish(self) -> None:
        """Declare the node pool as the inventory and device health say, in
        the node's order (``driver.slices.order``: full GPUs, shares and VFs
        before the MIG placements)."""
        self._published = True
        self.publisher.set_pool(
            PoolSpec(
                driver=DRIVER_NAME,
                pool_name=self.pool_name,
                name_prefix=slice_name_prefix(self.pool_name, DRIVER_NAME),
                node_selection={"nodeName": self.settings.node_name},
                devices=tuple(
                    node_order(self.health.tainted(self.inventory.devices(self.pool_name)))
                ),
                counter_sets=self._counter_sets,
                owner=self.owner,
            )
        )

    def health_changed(self) -> None:
        """A device's health changed: republish the node's pool, and report a
        fabric GPU's failure to the controller (whose pool it is in)."""
        self.publish()
        self.report_fabric()

    def detached_gpu(self, uuid: str) -> bool:
        """Whether ``uuid`` leaving NVML (XID 79) is a fabric detach: a GPU seen
        behind a fabric adapter that no prepared claim holds (the controller
        detaches no other; docs/health.md, "The fabric path")."""
        if uuid not in self._fabric_gpus or self.preparer is None:
            return False
        return uuid not in held_gpus(self.preparer.prepared_devices())

    def report_fabric(self) -> None:
        """Refresh the Node's fabric report (attached devices, which are held).

        Not before the preparer exists: a report without the held devices
        would let the controller detach a device a container still uses.
        """
        if self.fabric is None or self.fabric_report is None or self.preparer is None:
            return
        attached = self.inventory.devices(self.settings.fabric_pool)
        held = self.preparer.prepared_devices()
        failed = gpu_failures(self.health, attached)
        report = self.fabric.report(attached, held, self.fabric_usage, failed)
        self.fabric_report.set(report.to_annotation())

    def claim_serving(self) -> tuple[SocketPaths, ClaimPreparer]:
        """The kubelet sockets and the claim preparer with its one lock, both
        in the one rolling-update mode the settings say (``rolling_update``):
        then the lock takes the file both plugin pods share too."""
        s = self.settings
        rolling = s.rolling_update
        paths = socket_paths(
            registry_dir=s.registry_dir,
            plugin_dir=s.plugin_dir,
            pod_uid=s.pod_uid if rolling else None,
        )
        if self.store is None:
            self.store = checkpoint_store(s)
        preparer = ClaimPreparer(
            ApiClaimReader(self.api),
            self.inventory,
            all_handlers(self.device_types),
            self.store,
            CdiRegistry(s.cdi_root),
            lock=ClaimLock(paths.lock_file if rolling else None),
            sharing=gpu_sharing(s, self.device_types),
            metadata=MetadataFiles.in_plugin_dir(s.plugin_dir),  # KEP-5304
        )
        return paths, preparer

    def device_counts(self) -> DeviceCounts:
        """The device gauges' counts now (``plugin.device_metrics``)."""
        pools = {p: self.inventory.devices(p) for p in (self.pool_name, self.settings.fabric_pool)}
        held = self.preparer.prepared_devices() if self.preparer is not None else set()
        return DeviceCounts(pools, self.settings.fabric_pool, self.health, held)

    def nvml_reached(self) -> bool:
        """Whether every GPU family has reached NVML at least once."""
        return all(g.ever_available for g in self.gates)

    def health_detail(self) -> list[str]:
        """``/healthz`` lines for what is not offered and why (still 200)."""
        return [f"gpus: not offered: {g.reason}" for g in self.gates if g.reason]

    def healthy(self) -> bool:
        """Ready once the pool has been published and the servers are up; no
        longer once the hot-plug watch has ended (the process is going down)."""
        return self._serving and self.publisher.in_sync.is_set() and not self._hotplug_ended

    async def watch_hotplug(self, events: Iterator[Any]) -> None:
        """The hot-plug watch (:func:`driver.node.hotplug.watch`): a vital task
        that only ends by raising, which takes the task group down."""
        try:
            await hotplug.watch(events, self.rescan, arrivals=arrivals_of(self.device_types))
        finally:
            self._hotplug_ended = True

    def _rescan_on_passthrough(self, loop: asyncio.AbstractEventLoop) -> None:
        """A GPU bound to vfio-pci leaves NVML (and comes back): rescan at once."""
        rescans: set[asyncio.Task[None]] = set()

        def rescan() -> None:
            task = loop.create_task(self.rescan())
            rescans.add(task)
            task.add_done_callback(rescans.discard)

        def from_any_thread() -> None:
            loop.call_soon_threadsafe(rescan)

        for t in self.device_types:
            if isinstance(t, GpuType):
                t.passthrough.on_change = from_any_thread
                t.passthrough.on_handover = self.health.handed_over

    async def run(self) -> None:
        s = self.settings
        self.health.bind_loop()
        self._rescan_on_passthrough(asyncio.get_running_loop())
        if self.xid is not None:
            self.xid.start()
        set_process_fields(node=s.node_name)
        node = await wait_for_node(self.api, s.node_name)
        self.owner = owner_reference(node)
        node_events = ObjectEvents(self.recorder, ObjectRef.of(node, "Node"))
        self.health.events = self.publisher.events = node_events
        self.health_history.start(node)
        # Opened before the first scan: no event between them is lost (driver.pci.arrivals).
        events = hotplug.open_source(s.hotplug_source, s.sysfs_root)
        await self.rescan()
        paths, preparer = self.claim_serving()
        await preparer.recover()  # under the claim lock: another plugin pod may be preparing
        self.preparer = preparer
        preparer.on_change = self.report_fabric
        self.idle = idle_reporter(s, self.device_types, preparer, self.api)
        if self.idle is not None:
            export_idle_metrics(self.idle)
        recovery = gpu_recovery(s, self.device_types, self.health, self.xid, preparer)
        self.report_fabric()
        # Device health (KEP-4680) is served where NVML can deliver GPU XIDs.
        health = self.health if self.xid is not None else None
        servers = PluginServers(paths, preparer, health, advertise_health=self.nvml_reached())
        self.servers = servers
        PLUGIN_REGISTERED.set_function(lambda: float(servers.registration.registered.is_set()))
        export_device_counts(self)

        async def serve() -> None:
            self._serving = True
            await servers.run()
            self._serving = False
            # The whole checkpoint current for whatever build starts next
            # (docs/design.md, "Upgrades and downgrades": the journal).
            await preparer.compact()
            raise Stopped  # the servers have shut down: end the task group

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.publisher.run(), name="slice-publisher")
                group.create_task(self.recorder.run(), name="events")
                group.create_task(self.health_history.annotation.run(), name="health-history")
                if recovery is not None:
                    group.create_task(recovery.run(), name="gpu-recovery")
                if self.fabric_report is not None:
                    group.create_task(self.fabric_report.run(), name="fabric-report")
                if self.fabric_usage is not None:
                    group.create_task(self.fabric_usage.run(), name="fabric-usage")
                if self.idle is not None:
                    group.create_task(self.idle.run(), name="idle-devices")
                group.create_task(serve(), name="grpc-servers")
                if s.metrics_port:
                    group.create_task(
                        serve_http(s.metrics_port, PLUGIN, self.healthy, detail=self.health_detail),
                        name="http",
                    )
                if self.gates and not s.nvml_required:
                    group.create_task(
                        retry_while_unavailable(self.gates, self.rescan), name="nvml-retry"
                    )
                if events is not None:
                    group.create_task(self.watch_hotplug(events), name="hotplug")
        except* Stopped:
            log.info("plugin stopped")
        finally:
            if self.xid is not None:
                await asyncio.to_thread(self.xid.stop)
