"""Settings of the node plugin process (``patchbay-plugin``).

Each field is one setting: flag ``--<field-with-dashes>``, env var
``<FIELD_UPPER>``, Helm value ``kubeletPlugin.<fieldCamel>``; except
``fabric_pool``, which the controller reads too: it has one Helm value,
``controller.fabricPool``, that feeds both processes. The MPS settings
(``driver.gpu.sharing.settings``) are the MPS supervisor's too, from the same
``kubeletPlugin`` values. The GPU health policy (``driver.health.policy``)
and idle detection (``driver.idle.settings``) are the plugin's alone.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from driver.fabric_devices.settings import FabricPoolSettings
from driver.gpu.sharing.settings import MpsSettings
from driver.health.policy import HealthSettings
from driver.httpendpoint import MetricsPortSettings
from driver.idle.settings import IdleSettings
from driver.process import ProcessSettings


class PluginSettings(
    ProcessSettings,
    FabricPoolSettings,
    MetricsPortSettings,
    MpsSettings,
    HealthSettings,
    IdleSettings,
):
    """patchbay node plugin: publishes this node's devices and prepares claims."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_name: str = Field(description="name of the Node this plugin serves")
    kubeconfig: str | None = Field(default=None, description="kubeconfig file; in-cluster if unset")
    registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="kubelet plugin registration directory",
    )
    plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins/patchbay.dev"),
        description="directory for the DRA socket, checkpoint and lock",
    )
    pod_uid: str | None = Field(
        default=None,
        description="own pod UID: enables rolling updates (UID socket names, shared "
        "checkpoint, cross-process prepare lock); unset or empty: off",
    )
    cdi_root: Path = Field(default=Path("/var/run/cdi"), description="CDI spec directory")
    sysfs_root: Path = Field(
        default=Path("/sys"), description="sysfs mount to discover PCI topology"
    )
    dev_root: Path = Field(default=Path("/dev"), description="device node directory of the host")
    nvml_required: bool = Field(
        default=False,
        description="exit (discovery error, exit code 3) when NVML cannot be initialised "
        "(no library, driver not loaded); off: serve the node's other devices without "
        "GPUs and retry NVML with backoff",
    )
    boot_id_file: Path = Field(
        default=Path("/proc/sys/kernel/random/boot_id"),
        description="file holding the node's boot id (checkpoint reset on reboot)",
    )
    hotplug_source: str = Field(
        default="udev",
        description="PCI hot-plug events: 'udev', 'feed:<path>' (simulated host), or 'none'",
    )
    vf_config: Path | None = Field(
        default=None,
        description="YAML/JSON file selecting SR-IOV PFs (and numVfs); unset: no VFs offered",
    )
    nvme_drives: str = Field(
        default="",
        description="local NVMe drives offered to claims: 'all' or serials/PCI addresses; "
        "empty: none (drives behind a fabric adapter are offered to their fabric claim)",
    )
    mig_gpus: str = Field(
        default="",
        description="GPUs dynamic MIG may partition: 'all' or NVML indices/UUIDs; empty: no MIG",
    )
    mig_profiles: str = Field(
        default="", description="MIG profiles offered ('1g,3g.40gb'); empty: every profile"
    )
    mig_media_extensions: bool = Field(default=True, description="also offer '+me' MIG profiles")
    mig_orphan_cleanup: bool = Field(
        default=False, description="destroy MIG instances no claim owns at start (else report)"
    )
    shared_gpus: str = Field(
        default="",
        description="GPUs also offered as fractional GPUs (consumable memory and cores, "
        "DeviceClass shared-gpu.patchbay.dev): 'all' or NVML indices/UUIDs; empty: none",
    )
    shared_gpu_memory_step: int = Field(
        default=1024,
        description="MiB: a fractional GPU's memory request is rounded up to a multiple of it",
    )
    compatibility_groups: bool = Field(
        default=False,
        description="say 'one mode per GPU' with device compatibility groups (KEP-5963): "
        "MIG placements in group 'mig', fractional GPUs in 'shared' (consuming none of "
        "the GPU's counters), the full GPU in none; needs the alpha gate "
        "DRADeviceCompatibilityGroups on the apiserver and scheduler (without it the "
        "scheduler ignores the node's pool); off: the whole-counter trick",
    )
    hami_core_library: Path | None = Field(
        default=None,
        description="HAMi-core's libvgpu.so on the node: mounted into containers of fractional "
        "GPUs with /etc/ld.so.preload so their limits bind; unset: the limits are advisory",
    )
    nvidia_smi: str = Field(
        default="",
        description="nvidia-smi binary: sets a TimeSlicing claim's interval (compute-policy); "
        "empty: usr/bin/nvidia-smi below --driver-root",
    )
    mps_supervisor: bool = Field(
        default=False,
        description="MPS daemons are run by patchbay-mps-supervisor (a pod of its own, "
        "which a plugin rolling update leaves running), told through want files in "
        "--mps-root; off: the plugin starts them itself, in a session of its own",
    )
    fabric_adapters: str = Field(
        default="",
        description="fabric host adapters of this node as 'name=portBDF,...' or 'file:<path>' "
        "(a node-local file with that list; absent: none); GPUs behind them are "
        "fabric-attached (never offered as local) and reported in the Node annotation",
    )

    @property
    def nvidia_smi_path(self) -> Path:
        return self.driver_tool("nvidia-smi", self.nvidia_smi)

    @property
    def rolling_update(self) -> bool:
        """Whether two plugin pods may serve this node at once (kubelet 1.33+).

        The one test of the mode: on with a non-empty ``pod_uid``. It names the
        sockets with the UID, shares the checkpoint (re-read on every call) and
        takes the cross-process prepare lock; all three or none.
        """
        return bool(self.pod_uid)
