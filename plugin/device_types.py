"""Which device families this plugin serves, built from its settings.

The one place that lists the families; each family lives in ``driver/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.cxl.kind import CxlMemoryType
from driver.devices.kind import DeviceType
from driver.fabric_devices.node import FabricNodeView, load_adapters
from driver.gpu.fraction import SharePolicy
from driver.gpu.kind import GpuType
from driver.gpu.sharing.claims import GpuSharing
from driver.gpu.sharing.handoff import MpsHandoff
from driver.gpu.sharing.mps import MpsDaemons
from driver.health.xid import XidWatcher
from driver.idle.conditions import ConditionWriter
from driver.idle.reporter import IdleReporter
from driver.idle.sampler import UtilizationSampler
from driver.idle.sources import watched
from driver.idle.window import IdlePolicy
from driver.kube.client import KubeClient
from driver.mig.discovery import mig_support
from driver.nvme.kind import DriveSelection, NvmeType
from driver.nvml.pynvml_backend import PynvmlBackend
from driver.pci.arrivals import Arrivals
from driver.vf.config import load_pool_config
from driver.vf.kind import VfType
from plugin.settings import PluginSettings


def fabric_view(settings: PluginSettings) -> FabricNodeView | None:
    """This node's fabric adapters (``--fabric-adapters``), None when it has none."""
    adapters = load_adapters(settings.fabric_adapters) if settings.fabric_adapters else {}
    return FabricNodeView(settings.node_name, adapters, settings.sysfs_root) if adapters else None


def device_types(settings: PluginSettings, store: CheckpointStore) -> list[DeviceType]:
    """The families, over the process's one checkpoint store (dynamic MIG reads it)."""
    nvml = PynvmlBackend(settings.driver_root)
    # Discovery and the MIG handler share one NVML session lock (driver.mig.session).
    mig = mig_support(
        nvml,
        settings.mig_gpus,
        settings.mig_profiles,
        settings.mig_media_extensions,
        settings.mig_orphan_cleanup,
        dev_root=settings.dev_root,
        checkpoint=store,
        shared_checkpoint=settings.rolling_update,
    )
    # VFs of a NIC the fabric attached are scanned whatever the PF selection says:
    # the plugin offers its VF 0 to the fabric claim that asked for the NIC.
    fabric = fabric_view(settings)
    behind = fabric.behind_adapter if fabric is not None else None
    families: list[DeviceType] = [
        GpuType(
            nvml,
            settings.sysfs_root,
            settings.dev_root,
            mig=mig,
            events=nvml,
            share=SharePolicy.parse(settings.shared_gpus, settings.shared_gpu_memory_step),
            hami_library=settings.hami_core_library,
            state_dir=settings.plugin_dir,
            compatibility_groups=settings.compatibility_groups,
            placement=fabric.place if fabric is not None else None,
        ),
        VfType(
            load_pool_config(settings.vf_config),
            settings.sysfs_root,
            settings.dev_root,
            always=behind,
            arrivals=Arrivals(tracking=settings.hotplug_source != "none"),
        ),
        NvmeType(
            DriveSelection.parse(settings.nvme_drives),
            settings.sysfs_root,
            settings.dev_root,
            always=behind,
        ),
    ]
    if behind is not None:  # CXL memory comes only from the fabric
        families.append(CxlMemoryType(settings.sysfs_root, settings.dev_root, behind))
    return families


def xid_watcher(
    types: Sequence[DeviceType], on_xid: Callable[[str, int], None]
) -> XidWatcher | None:
    """The XID watcher of the GPU family, if this plugin serves GPUs with NVML events."""
    for t in types:
        if isinstance(t, GpuType):
            return t.xid_watcher(on_xid)
    return None


def arrivals_of(types: Sequence[DeviceType]) -> Arrivals | None:
    """What the hot-plug watch tells the families that change PCI functions
    (the VF family sets PFs' VF counts); None when none does."""
    for t in types:
        if isinstance(t, VfType):
            return t.arrivals
    return None


def gpu_sharing(settings: PluginSettings, types: Sequence[DeviceType]) -> GpuSharing | None:
    """``GpuConfig.sharing`` of the GPU family (``--nvidia-smi``, ``--mps-control``,
    ``--mps-root``, ``--mps-supervisor``); None when this plugin serves no GPUs through NVML."""
    for t in types:
        if isinstance(t, GpuType) and t.nvml is not None:
            daemons = MpsDaemons(settings.mps_control_path, settings.mps_root)
            mps = MpsHandoff(daemons, supervised=settings.mps_supervisor)
            return GpuSharing(t.nvml, settings.nvidia_smi_path, mps, t.nvml_lock)
    return None


def idle_reporter(
    settings: PluginSettings, types: Sequence[DeviceType], preparer: ClaimPreparer, api: KubeClient
) -> IdleReporter | None:
    """Idle detection of the prepared GPUs and MIG devices (``--idle-sample-interval``,
    ``--idle-threshold``, ``--idle-window``); None when it is off or no family reads NVML."""
    if settings.idle_sample_interval <= 0:
        return None
    for t in types:
        if isinstance(t, GpuType) and t.nvml is not None:
            sampler = UtilizationSampler(t.nvml, t.nvml_lock)
            return IdleReporter(
                IdlePolicy(settings.idle_threshold, settings.idle_window),
                settings.idle_sample_interval,
                sampler.read,
                lambda: watched(preparer.checkpoint),
                ConditionWriter(api),
            )
    return None
