"""The two configs of the VF family: which PFs to offer, and how to prepare a VF.

:class:`PfPoolConfig` is the node plugin's own file (``--vf-config``): a list
of PF selectors, each optionally with the number of VFs to create. Nothing is
offered without it, because handing every NIC on a node to tenants is not a
safe default. :class:`VfConfig` is the opaque per-claim (or per-class)
config that picks the prepare mode; it registers itself with
:mod:`driver.config.opaque` so the claim preparer decodes it like any kind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from driver.config.opaque import DeviceConfig, register_kind
from driver.devices import quantity
from driver.errors import ConfigError

HEX16 = r"^(0x)?[0-9a-fA-F]{4}$"
MAX_BANDWIDTH_TIERS = 8  # one device per tier per VF: keeps a PF's devices few
BDF = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"


class VfConfig(DeviceConfig):
    """Opaque config for ``vf`` devices: ``netdev`` keeps the kernel driver,
    ``vfio-pci`` rebinds the VF for user-space drivers (DPDK, VMs)."""

    device_types: ClassVar[frozenset[str]] = frozenset({"vf"})
    mode: Literal["netdev", "vfio-pci"] = "netdev"


register_kind(VfConfig)


def mbps(raw: str | int) -> int:
    """A rate in bits per second as a quantity (``40G``, ``2500M``) -> whole Mb/s."""
    value, _ = quantity.parse(str(raw))
    rate = value / 1_000_000
    if rate <= 0 or rate.denominator != 1:
        raise ValueError(f"{raw!r} is not a positive whole number of Mb/s (e.g. 40G, 2500M)")
    return int(rate)


def normalize_id(raw: str) -> str:
    """A PCI vendor/device id as 4 lowercase hex digits ("0x15B3" -> "15b3")."""
    return raw.lower().removeprefix("0x").zfill(4)


class PfSelector(BaseModel):
    """One PF selector; every field given must match (fields are ANDed,
    entries of the list are ORed). ``numVfs`` set: create that many VFs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str | None = Field(default=None, description="PF netdev name, e.g. ens1f0np0")
    pci_address: str | None = Field(default=None, alias="pciAddress", pattern=BDF)
    vendor_id: str | None = Field(default=None, alias="vendorID", pattern=HEX16)
    device_id: str | None = Field(default=None, alias="deviceID", pattern=HEX16)
    num_vfs: int | None = Field(default=None, alias="numVfs", ge=0, le=256)
    # Per-PF VF bandwidth (driver.vf.bandwidth): the VF shares offered, in
    # bits per second (``[10G, 40G]``, stored as Mb/s); unset: VFs unmanaged.
    bandwidth_tiers: tuple[int, ...] | None = Field(default=None, alias="bandwidthTiers")
    # The PF's line rate when its ``net/<if>/speed`` is unknown or wrong.
    line_rate: int | None = Field(default=None, alias="lineRate")

    @field_validator("bandwidth_tiers", mode="before")
    @classmethod
    def _tiers(cls, raw: object) -> object:
        if raw is None:
            return None
        if not isinstance(raw, list | tuple) or not raw:
            raise ValueError("must be a non-empty list of rates, e.g. [10G, 40G]")
        tiers = sorted({mbps(t) for t in raw})
        if len(tiers) > MAX_BANDWIDTH_TIERS:
            raise ValueError(f"{len(tiers)} tiers (at most {MAX_BANDWIDTH_TIERS})")
        return tuple(tiers)

    @field_validator("line_rate", mode="before")
    @classmethod
    def _line_rate(cls, raw: object) -> object:
        return None if raw is None else mbps(str(raw))

    @model_validator(mode="after")
    def _selects_something(self) -> PfSelector:
        if not any((self.name, self.pci_address, self.vendor_id, self.device_id)):
            raise ValueError(
                "a selector needs at least one of name, pciAddress, vendorID, deviceID"
            )
        return self

    def matches(self, name: str | None, bdf: str, vendor: str, device: str) -> bool:
        checks = (
            (self.name, name),
            (self.pci_address and self.pci_address.lower(), bdf),
            (self.vendor_id and normalize_id(self.vendor_id), vendor),
            (self.device_id and normalize_id(self.device_id), device),
        )
        return all(want is None or want == have for want, have in checks)


class PfPoolConfig(BaseModel):
    """Contents of the ``--vf-config`` file (YAML or JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pfs: list[PfSelector] = Field(default_factory=list)

    def select(self, name: str | None, bdf: str, vendor: str, device: str) -> PfSelector | None:
        """The first selector matching this PF, or None (not offered)."""
        for selector in self.pfs:
            if selector.matches(name, bdf, vendor, device):
                return selector
        return None


def load_pool_config(path: Path | None) -> PfPoolConfig:
    """The PF selection from ``path``; empty (no VFs offered) when unset."""
    if path is None:
        return PfPoolConfig()
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else _yaml(text)
        return PfPoolConfig.model_validate(data or {})
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            details = "; ".join(
                f"field {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"vf config {path}: {details}") from exc
        raise ConfigError(f"vf config {path}: {exc}") from exc


def _yaml(text: str) -> object:
    """A YAML file's data; PyYAML (1.6 MB resident, 25 ms) is imported only
    for one: every plugin process loads this module, few read such a file."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}") from exc
