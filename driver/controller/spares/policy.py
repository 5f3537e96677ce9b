"""Warm spares: which idle fabric devices to keep attached, where, and which to let go.

Why: a fabric device reaches a pod only after its attach, and the 1.37
scheduler re-checks binding conditions every 5 s, so a fabric pod is
Running 5 s after its allocation however fast the attach. A spare is a
free device attached in advance to a node; its variant there is published
without binding conditions, so a pod that takes it binds at once. The
policy (docs/fabric.md, "Warm spares"):

- fixed: ``kind:model=N`` spares on every node that reports the adapters;
- demand: after an allocation of ``kind:model`` on a node, up to N spares
  of it there for ``window`` seconds (``kind:*`` for any model);
- an idle timeout: a spare above the fixed floor that no pod took within
  ``idle_timeout`` seconds is detached, and closes its node's demand window
  (no new one until the next allocation there);
- a cap: spares never number more than ``cap`` (a share) of the pool;
- replacements (``replace_failed``): one more on a node for each GPU it
  lost (``driver.controller.spares.replace``), never idle.

Pure functions over the pool's state as the reconciler sees it
(``driver.controller.spares.keeper`` gathers it and carries the plan out);
``now`` is the caller's monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KindModel = tuple[str, str]
Key = tuple[str, str, str]  # (node, kind, model)
ANY_MODEL = "*"
KINDS = ("gpu", "nic", "nvme", "cxlmem")


def parse_counts(text: str, name: str, wildcard: bool = False) -> dict[KindModel, int]:
    """``kind:model=N`` entries separated by ``,`` (``kind:*`` with ``wildcard``);
    a ValueError naming ``name`` and the entry that is wrong."""
    out: dict[KindModel, int] = {}
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        head, eq, count = entry.rpartition("=")
        kind, colon, model = head.partition(":")
        kind, model = kind.strip(), model.strip()
        if not (eq and colon and kind and model and count.strip().isdigit()):
            raise ValueError(f"{name}: {entry!r} is not kind:model=N")
        if kind not in KINDS:
            raise ValueError(f"{name}: {entry!r}: kind {kind!r} is none of {', '.join(KINDS)}")
        if model == ANY_MODEL and not wildcard:
            raise ValueError(f"{name}: {entry!r}: a model is required ('*' is for demand only)")
        out[(kind, model)] = int(count)
    return out


@dataclass(frozen=True)
class SpareRules:
    """The policy's values (``driver.controller.spares.settings`` reads them)."""

    fixed: Mapping[KindModel, int] = field(default_factory=dict)
    demand: Mapping[KindModel, int] = field(default_factory=dict)
    window: float = 600.0
    cap: float = 0.25
    idle_timeout: float = 300.0
    replace_failed: bool = False  # a spare for each GPU a node lost (spares.replace)

    @property
    def enabled(self) -> bool:
        return any(self.fixed.values()) or any(self.demand.values()) or self.replace_failed

    def floor(self, kind: str, model: str) -> int:
        return self.fixed.get((kind, model), 0)

    def on_demand(self, kind: str, model: str) -> int:
        return self.demand.get((kind, model), self.demand.get((kind, ANY_MODEL), 0))

    def window_open(self, demand_at: float | None, now: float) -> bool:
        return demand_at is not None and now < demand_at + self.window

    def wanted(self, key: Key, demand_at: float | None, now: float) -> int:
        """Spares wanted for ``key`` now: the fixed floor, or the demand count
        while the node's demand window for that model is open."""
        _, kind, model = key
        extra = self.on_demand(kind, model) if self.window_open(demand_at, now) else 0
        return max(self.floor(kind, model), extra)

    def limit(self, pool_size: int) -> int:
        """The cap in devices: ``cap`` of the pool's physical devices, rounded down."""
        return math.floor(self.cap * pool_size + 1e-9)


@dataclass(frozen=True)
class Spare:
    """A device attached (or attaching) to a node that no allocation needs."""

    device_id: str
    kind: str
    model: str
    node: str
    adapter: str
    ready: bool  # attached and reported by its node: its variant there needs no wait
    since: float  # when it became a spare (attach started, or found attached)
    healthy: bool = True  # healthy, available, and its node reports its adapter
    why: str = ""  # why it is not healthy, when not the usual (Retire's reason)

    @property
    def key(self) -> Key:
        return (self.node, self.kind, self.model)


@dataclass(frozen=True)
class Free:
    """A device no one holds or attaches, and where it could be attached."""

    device_id: str
    kind: str
    model: str
    places: tuple[tuple[str, str], ...]  # (node, adapter), sorted


@dataclass(frozen=True)
class Retire:
    spare: Spare
    why: str  # "idle", "not wanted", "over the cap", "unhealthy"


@dataclass(frozen=True)
class SparePlan:
    keep: tuple[Spare, ...] = ()
    attach: tuple[tuple[str, str, str], ...] = ()  # (device, node, adapter)
    retire: tuple[Retire, ...] = ()
    closed: frozenset[Key] = frozenset()  # demand windows an idle spare closed
    wake_at: float | None = None  # when a timeout or a window ends next


def wants(
    rules: SpareRules, nodes: Iterable[str], models: Iterable[KindModel],
    demand: Mapping[Key, float], now: float, carried: Mapping[Key, int] | None = None,
    extra: Mapping[Key, int] | None = None,
) -> dict[Key, int]:  # fmt: skip
    """Key -> spares wanted, for every key the policy wants any of;
    ``carried``: what a restart found there (kept, never added to);
    ``extra``: replacements for lost GPUs (``spares.replace``), on top."""
    carried, extra = carried or {}, extra or {}
    keys = {(n, k, m) for n in nodes for (k, m), c in rules.fixed.items() if c > 0}
    keys |= {key for key in demand if key[0] in set(nodes) and (key[1], key[2]) in set(models)}
    keys |= {key for key in (*carried, *extra) if key[0] in set(nodes)}
    out = {
        key: max(rules.wanted(key, demand.get(key), now), carried.get(key, 0)) + extra.get(key, 0)
        for key in keys
    }
    return {key: n for key, n in out.items() if n > 0}


def _keep_per_key(
    rules: SpareRules, group: list[Spare], wanted: int, now: float, replacing: int = 0
) -> tuple[list[Spare], list[Retire], bool]:
    """The oldest ``wanted`` spares of one key stay (the fixed floor and
    ``replacing``, the replacements, first); a ready one above that floor
    idle past the timeout goes and closes the key's demand window (True)."""
    kept: list[Spare] = []
    retired: list[Retire] = []
    closed = False
    for s in sorted(group, key=lambda s: (s.since, s.device_id)):
        floor = rules.floor(s.kind, s.model) + replacing
        if not s.healthy:
            retired.append(Retire(s, s.why or "unhealthy"))
        elif len(kept) >= wanted:
            retired.append(Retire(s, "not wanted"))
        elif len(kept) >= floor and s.ready and now >= s.since + rules.idle_timeout:
            retired.append(Retire(s, "idle"))
            closed, wanted = True, floor
        else:
            kept.append(s)
    return kept, retired, closed


def plan(
    rules: SpareRules,
    spares: Iterable[Spare],
    free: Iterable[Free],
    pool_size: int,
    nodes: Iterable[str],
    demand: Mapping[Key, float],
    now: float,
    carried: Mapping[Key, int] | None = None,
    extra: Mapping[Key, int] | None = None,
) -> SparePlan:
    """What to keep, attach and detach so the spares meet the policy under the cap.

    ``spares``: the devices attached or attaching that no allocation needs;
    ``free``: those that could become spares; ``nodes``: the nodes whose
    plugin reports its adapters; ``demand``: when each (node, kind, model)
    last saw an allocation; ``pool_size``: the pool's physical devices;
    ``carried``: the spares a restarted controller found per key, wanted
    as they are (their idle timeout still applies) and never added to;
    ``extra``: replacements wanted per key (``spares.replace``), on top of
    the rest and never idle.
    """
    extra = extra or {}
    spares, free, nodes = list(spares), list(free), sorted(set(nodes))
    models = {(s.kind, s.model) for s in spares} | {(f.kind, f.model) for f in free}
    want = wants(rules, nodes, models, demand, now, carried, extra)
    by_key: dict[Key, list[Spare]] = {}
    for s in spares:
        by_key.setdefault(s.key, []).append(s)
    keep: list[Spare] = []
    retire: list[Retire] = []
    closed: set[Key] = set()
    for key, group in sorted(by_key.items()):
        kept, retired, was_closed = _keep_per_key(
            rules, group, want.get(key, 0), now, extra.get(key, 0)
        )
        keep += kept
        retire += retired
        if was_closed:
            closed.add(key)
            want[key] = rules.floor(key[1], key[2]) + extra.get(key, 0)
    limit = rules.limit(pool_size)
    if len(keep) > limit:  # the newest go first
        order = sorted(keep, key=lambda s: (s.since, s.device_id))
        keep, over = order[:limit], order[limit:]
        retire += [Retire(s, "over the cap") for s in over]
    attach = _fill(rules, want, keep, free, limit)
    wake = [s.since + rules.idle_timeout for s in keep if s.ready]
    wake += [t + rules.window for k, t in demand.items() if rules.window_open(t, now)]
    return SparePlan(
        tuple(keep), tuple(attach), tuple(retire), frozenset(closed), min(wake, default=None)
    )


def _fill(
    rules: SpareRules, want: Mapping[Key, int], keep: list[Spare], free: list[Free], limit: int
) -> list[tuple[str, str, str]]:
    """Free devices to attach for the keys short of spares, fixed floors
    first, while the cap allows; a device reachable from fewer nodes first
    (those that more nodes reach stay for claims)."""
    have: dict[Key, int] = {}
    for s in keep:
        have[s.key] = have.get(s.key, 0) + 1
    total = len(keep)
    taken: set[str] = set()
    out: list[tuple[str, str, str]] = []
    order = sorted(want, key=lambda k: (rules.floor(k[1], k[2]) == 0, k))
    candidates = sorted(free, key=lambda f: (len(f.places), f.device_id))
    for key in order:
        node, kind, model = key
        for f in candidates:
            if total >= limit or have.get(key, 0) >= want[key]:
                break
            if f.device_id in taken or (f.kind, f.model) != (kind, model):
                continue
            adapter = next((a for n, a in f.places if n == node), None)
            if adapter is not None:
                out.append((f.device_id, node, adapter))
                taken.add(f.device_id)
                have[key] = have.get(key, 0) + 1
                total += 1
    return out
