"""Which device families this plugin serves, built from its settings.

The one place that lists the families; each family lives in ``driver/``.
"""

from __future__ import annotations

from driver.devices.kind import DeviceType
from driver.gpu.kind import GpuType
from driver.nvml.pynvml_backend import PynvmlBackend
from driver.vf.config import load_pool_config
from driver.vf.kind import VfType
from plugin.settings import PluginSettings


def device_types(settings: PluginSettings) -> list[DeviceType]:
    return [
        GpuType(PynvmlBackend(), settings.sysfs_root, settings.dev_root),
        VfType(load_pool_config(settings.vf_config), settings.sysfs_root, settings.dev_root),
    ]
