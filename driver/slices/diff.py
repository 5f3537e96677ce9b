"""Decide whether the stored slices of a pool already say what we want.

The apiserver may add defaulted fields to what we wrote, so a stored object
matches a desired one when every field we set has the same value and every
extra stored field is empty. Writing only on a real difference is what keeps
a node at zero slice writes per minute at rest. Values are compared as they
are: the apiserver canonicalises quantities (``81920Mi`` is stored as
``80Gi``), so the device model publishes them canonical already
(:mod:`driver.devices.quantity`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.slices.build import DesiredSlice


def _empty(value: Any) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""


def matches(desired: Any, stored: Any) -> bool:
    """True when ``stored`` says the same as ``desired`` (defaults aside)."""
    if _empty(desired) and _empty(stored):
        return True  # e.g. an empty device list the apiserver omits
    if isinstance(desired, Mapping):
        if not isinstance(stored, Mapping):
            return False
        if any(not matches(v, stored.get(k)) for k, v in desired.items()):
            return False
        return all(_empty(v) for k, v in stored.items() if k not in desired)
    if isinstance(desired, list):
        if not isinstance(stored, list) or len(desired) != len(stored):
            return False
        return all(matches(d, s) for d, s in zip(desired, stored, strict=True))
    return bool(desired == stored)


@dataclass(frozen=True)
class PoolDiff:
    """What to write to make the stored pool match the desired one."""

    in_sync: bool
    generation: int  # the generation to write (unchanged when in sync)
    to_create: tuple[str, ...]
    to_update: tuple[str, ...]
    to_delete: tuple[str, ...]


def _spec_without_pool(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.get("spec", {}).items() if k != "pool"}


def diff_pool(
    desired: Sequence[DesiredSlice],
    stored: Mapping[str, Mapping[str, Any]],
    owner: Mapping[str, Any] | None,
    last_written: int = 0,
) -> PoolDiff:
    """Compare the desired slices with the stored ones (by name).

    Any difference rewrites the whole pool at a new generation, so the
    scheduler never combines slices from two versions of the pool. The new
    generation is above both what is stored and ``last_written``, so it only
    ever grows, even when every slice was deleted behind our back.
    """
    generations = {int(o["spec"]["pool"].get("generation", 0)) for o in stored.values()}
    counts = {int(o["spec"]["pool"].get("resourceSliceCount", 0)) for o in stored.values()}
    current = max(generations, default=0)
    wanted = {d.name: d for d in desired}
    in_sync = (
        set(wanted) == set(stored)
        and len(generations) == 1
        and counts == {len(desired)}
        and all(matches(d.spec, _spec_without_pool(stored[n])) for n, d in wanted.items())
        and all(_owner_ok(stored[n], owner) for n in wanted)
    )
    if in_sync:
        return PoolDiff(True, current, (), (), ())
    return PoolDiff(
        in_sync=False,
        generation=max(current, last_written) + 1,
        to_create=tuple(n for n in wanted if n not in stored),
        to_update=tuple(n for n in wanted if n in stored),
        to_delete=tuple(sorted(n for n in stored if n not in wanted)),
    )


def renewal(diff: PoolDiff, desired: Sequence[DesiredSlice], last_written: int = 0) -> PoolDiff:
    """An in-sync pool written again as it is: every slice updated at a new
    generation (the write is the point, not a difference)."""
    assert diff.in_sync
    names = tuple(d.name for d in desired)
    return PoolDiff(False, max(diff.generation, last_written) + 1, (), names, ())


def _owner_ok(obj: Mapping[str, Any], owner: Mapping[str, Any] | None) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    if owner is None:
        return not refs
    return any(r.get("uid") == owner.get("uid") for r in refs)
