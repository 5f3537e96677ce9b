"""The exception tree of patchbay.

Every error we raise on purpose derives from :class:`PatchbayError`, so a
caller can tell our own failures (bad input, a device in the wrong state)
from bugs. Errors that wrap a lower-level failure chain it with ``raise ...
from exc`` so the cause is never lost.
"""

from __future__ import annotations


class PatchbayError(Exception):
    """Base of every error patchbay raises deliberately."""


class ConfigError(PatchbayError):
    """A setting, flag or opaque claim configuration is invalid."""


class ClaimError(PatchbayError):
    """A ResourceClaim cannot be prepared or unprepared as asked."""


class DeviceError(PatchbayError):
    """A device is missing, busy or in a state that forbids the operation."""


class CheckpointError(PatchbayError):
    """The plugin's checkpoint file cannot be read or written."""


class CdiError(PatchbayError):
    """A CDI spec cannot be written or removed."""


class DiscoveryError(PatchbayError):
    """Hardware discovery (NVML, sysfs) failed."""


class HotplugError(DiscoveryError):
    """The hot-plug event source ended or failed; the plugin must restart."""


class ApiError(PatchbayError):
    """A Kubernetes API call failed in a way the caller must handle."""


class NvmlError(DiscoveryError):
    """An NVML call failed; ``name`` is NVML's return code without its prefix.

    ``code`` is the numeric ``nvmlReturn_t`` (e.g. 15) and ``name`` its NVML
    name (e.g. ``"GPU_IS_LOST"``), so callers can branch on the cause the same
    way whether the in-memory fake or the real library raised it.
    """

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"NVML {name} ({code}): {message}")
        self.code = code
        self.name = name
        self.message = message


class NvmlDeviceError(NvmlError, DeviceError):
    """An NVML call that changes a device (MIG mode, MIG instances) failed."""
