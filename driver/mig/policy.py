"""Which GPUs the operator lets patchbay partition, and into which profiles.

The settings (``--mig-gpus``, ``--mig-profiles``, ``--mig-media-extensions``,
``--mig-orphan-cleanup``) arrive here as plain values; this module owns
their meaning so the plugin settings stay a flat list.

- ``mig_gpus``: empty (the default) disables dynamic MIG; ``all`` takes every
  MIG-capable GPU; otherwise a comma list of NVML indices or GPU UUIDs.
- ``mig_profiles``: empty offers every profile; otherwise a comma list of
  profile names (``3g.40gb``) or compute sizes (``1g`` matches ``1g.10gb``
  and ``1g.20gb``).
- ``mig_media_extensions``: also offer the ``+me`` profiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.errors import ConfigError
from driver.mig.session import toggles_mig_mode
from driver.nvml.backend import GpuInfo, MigProfile


def _items(raw: str) -> frozenset[str]:
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


@dataclass(frozen=True)
class MigPolicy:
    gpus: frozenset[str]  # empty: none; {"all"}: every MIG-capable GPU
    profiles: frozenset[str]  # empty: every profile
    media_extensions: bool = True
    orphan_cleanup: bool = False

    @classmethod
    def parse(
        cls, gpus: str, profiles: str, media_extensions: bool, orphan_cleanup: bool
    ) -> MigPolicy:
        chosen = _items(gpus)
        if "all" in chosen and len(chosen) > 1:
            raise ConfigError(f"mig-gpus: 'all' cannot be combined with a list: {gpus!r}")
        return cls(chosen, _items(profiles), media_extensions, orphan_cleanup)

    @property
    def enabled(self) -> bool:
        return bool(self.gpus)

    def selects(self, gpu: GpuInfo) -> bool:
        """The operator lets us partition ``gpu`` (whether it can is another matter)."""
        return "all" in self.gpus or gpu.uuid in self.gpus or str(gpu.index) in self.gpus

    def partitionable(self, gpu: GpuInfo) -> bool:
        """Selected, MIG-capable, and either switchable by us or already in MIG mode."""
        if not (gpu.mig_capable and self.selects(gpu)):
            return False
        return toggles_mig_mode(gpu) or gpu.mig_mode_current

    def offers(self, profile: MigProfile) -> bool:
        if profile.name.endswith("+me") and not self.media_extensions:
            return False
        if not self.profiles:
            return True
        base = profile.name.removesuffix("+me")
        return bool({profile.name, base, base.split(".")[0]} & self.profiles)
