"""Decode and merge the opaque parameters of our driver's configs.

Every config is a JSON object with ``apiVersion: patchbay.dev/v1alpha1`` and
a ``kind`` naming one of the models registered here. Unknown fields are
rejected and every error names the field, so a user sees exactly what to
fix. Configs apply to the device types their kind is for; a kind that does
not fit a device fails that claim with a message naming both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from driver.config.sharing import GpuSharing
from driver.errors import ConfigError

API_VERSION = "patchbay.dev/v1alpha1"


class DeviceConfig(BaseModel):
    """Base of every opaque config kind."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    api_version: str = Field(alias="apiVersion")
    kind: str
    device_types: ClassVar[frozenset[str]] = frozenset()


class GpuConfig(DeviceConfig):
    """Options for a full GPU or a MIG slice."""

    device_types: ClassVar[frozenset[str]] = frozenset({"gpu", "mig"})
    driver_capabilities: list[str] | None = Field(default=None, alias="driverCapabilities")
    # How the claim's consumers share its GPUs (driver.config.sharing); None: exclusive.
    sharing: GpuSharing | None = None
    # "vfio-pci": hand the whole GPU to a VM (driver.gpu.passthrough); None: CUDA use.
    passthrough: Literal["vfio-pci"] | None = None

    @model_validator(mode="after")
    def _passthrough_alone(self) -> GpuConfig:
        if self.passthrough is not None:
            for name, value in (
                ("sharing", self.sharing),
                ("driverCapabilities", self.driver_capabilities),
            ):
                if value is not None:
                    raise ValueError(
                        f"{name}: not with passthrough {self.passthrough!r} (a GPU bound to "
                        "vfio-pci runs no CUDA on the host: a VM drives it)"
                    )
        return self


KINDS: dict[str, type[DeviceConfig]] = {"GpuConfig": GpuConfig}


def register_kind(model: type[DeviceConfig]) -> type[DeviceConfig]:
    """Add a config kind (device-type modules call this for their own kinds)."""
    KINDS[model.__name__] = model
    return model


def _field_path(error: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in error.get("loc", ())) or "(root)"


def decode(parameters: Mapping[str, Any], where: str) -> DeviceConfig:
    """One config's parameters as a typed model, or a :class:`ConfigError`
    naming ``where`` (e.g. ``config[1]``) and the offending field."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}: parameters must be a JSON object")
    api_version = parameters.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError(f"{where}: apiVersion must be {API_VERSION!r}, got {api_version!r}")
    kind = parameters.get("kind")
    model = KINDS.get(str(kind))
    if model is None:
        raise ConfigError(f"{where}: unknown kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    try:
        return model.model_validate(dict(parameters))
    except ValidationError as exc:
        details = "; ".join(f"field {_field_path(e)}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: invalid {kind}: {details}") from exc


def effective(
    configs: Sequence[DeviceConfig], device_type: str, device: str
) -> DeviceConfig | None:
    """The config that applies to a device: the last one given (later wins).

    Every config must fit the device type, otherwise the claim fails.
    """
    for config in configs:
        if device_type not in config.device_types:
            raise ConfigError(
                f"config kind {config.kind} does not apply to device {device} of type {device_type}"
            )
        if isinstance(config, GpuConfig) and config.passthrough and device_type != "gpu":
            raise ConfigError(
                f"passthrough {config.passthrough!r} applies to whole GPUs only, not to "
                f"device {device} of type {device_type}"
            )
    return configs[-1] if configs else None
