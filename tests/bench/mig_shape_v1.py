"""The MIG devices as plugins before issue 26 published them (the "before").

Why: the leaner slices must be judged against what they replace, and an
upgraded plugin must replace an old plugin's pool cleanly. The old shape is
no longer built by the plugin, so this rebuilds it from the lean one: every
placement of every profile (``+me`` ones at all seven starts), and each
placement repeating its parent GPU's ``productName``, ``architecture``,
``resource.kubernetes.io/pciBusID`` and ``minor`` (as ``parentMinor``) plus
``parentUUID``, ``parentIndex``, ``placementStart`` and the capacities
``multiprocessors`` and ``computeSlices``. :func:`old_shape` swaps it in for
discovery (``driver.mig.discovery`` builds its devices with it) while its
``with`` block runs; ``tests/unit/test_lean_slices.py`` checks that the
rebuilt pool has the bytes docs/scale.md measured before the change.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from unittest import mock

from driver.devices.model import PCI_BUS_ID, AttributeValue, Device
from driver.mig import layout
from driver.nvml.backend import MigProfile

# What each placement repeated of its parent GPU (the order is irrelevant:
# attributes are published sorted).
PARENT_ATTRIBUTES = ("productName", "architecture", PCI_BUS_ID)


def old_device(parent: Device, gpu_index: int, profile: MigProfile, start: int) -> Device:
    lean = layout.mig_device(parent, gpu_index, profile, start)
    attrs: dict[str, AttributeValue] = dict(lean.attributes)
    attrs |= {"parentUUID": parent.local_id, "parentIndex": gpu_index, "placementStart": start}
    attrs |= {k: parent.attributes[k] for k in PARENT_ATTRIBUTES if k in parent.attributes}
    minor = parent.attributes.get("minor")
    if isinstance(minor, int):
        attrs["parentMinor"] = minor
    capacity = dict(lean.capacity)
    capacity |= {
        "multiprocessors": str(profile.multiprocessors),
        "computeSlices": str(profile.compute_slices),
    }
    return replace(lean, attributes=attrs, capacity=capacity)


def old_devices(parent: Device, gpu_index: int, profiles: Sequence[MigProfile]) -> list[Device]:
    """Every (profile, placement), ``+me`` ones too, in table order."""
    return [
        old_device(parent, gpu_index, profile, start)
        for profile in profiles
        for start, _ in profile.placements
    ]


@contextmanager
def old_shape() -> Iterator[None]:
    """Discovery builds the old shape inside the block."""
    with mock.patch("driver.mig.discovery.mig_devices", old_devices):
        yield
