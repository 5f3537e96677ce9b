"""What the controller did that its caches do not show yet: client-go's expectations.

Why a module: the reconciler decides from two caches, the claims (watched)
and the fabric inventory (re-read after each operation), and an
operation's end triggers a pass at once, before either shows what the
operation did. A pass on that stale view would act again: ask for an
attach a second time, detach a device it just attached, count a spare
short. Like client-go's ``ControllerExpectations``, each thing done is
remembered here until the cache it lands in shows it:

- an allocation's *outcome* written to its claim (ready or failed), until
  the claims cache no longer shows the allocation waiting;
- a device a count-based manager *arrived* with for a slot allocation,
  until the claims cache shows it on the claim;
- a device whose operation *ended*, until an inventory requested after the
  end is in hand (the device is *settling* meanwhile);
- a count-based manager *asked* for a device on a node, until the device
  that arrived is recorded as the allocation's (or spare's): the manager
  attaches before it answers, so the inventory shows the device on that
  node, named by nothing, before the answer says whose it is (a *scale-up*
  is under way on the node meanwhile: nothing attached there is detached
  or taken up).

Concurrency: the controller's asyncio loop only. Monotonic time only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

Key = tuple[str, str]  # an allocation: (claim uid, variant name)


class Expectations:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._outcomes: set[Key] = set()
        self._arrivals: dict[Key, str] = {}
        self._ended: dict[str, float] = {}
        self._asking: Counter[str] = Counter()  # node -> scale-ups asked, not yet recorded

    # -- the claims cache ---------------------------------------------------

    def outcome_written(self, key: Key) -> None:
        self._outcomes.add(key)

    def outcome_pending(self, key: Key) -> bool:
        """Whether ``key``'s outcome was written and the cache does not show it yet."""
        return key in self._outcomes

    def arrived(self, key: Key, device_id: str) -> None:
        """``device_id`` serves slot allocation ``key`` (the manager's answer, or taken up)."""
        self._arrivals[key] = device_id

    def dropped(self, key: Key) -> None:
        """The device that arrived for ``key`` is not kept (its attach failed)."""
        self._arrivals.pop(key, None)

    def arrival(self, key: Key) -> str:
        """The device that arrived for ``key`` ("" if none)."""
        return self._arrivals.get(key, "")

    def serving(self, device_id: str) -> bool:
        """Whether ``device_id`` arrived for a slot allocation the cache has not caught up with."""
        return device_id in self._arrivals.values()

    def claims_show(self, waiting: Collection[Key]) -> None:
        """The claims cache shows these allocations still waiting: every other
        outcome and arrival is in it now (or its allocation is gone)."""
        self._outcomes.intersection_update(waiting)
        self._arrivals = {k: d for k, d in self._arrivals.items() if k in waiting}

    # -- the fabric inventory -----------------------------------------------

    def operation_ended(self, device_id: str) -> None:
        self._ended[device_id] = self._clock()

    def settling(self, device_id: str) -> bool:
        """Whether an operation on ``device_id`` ended after the inventory in
        hand was requested: what that inventory says of the device is stale."""
        return device_id in self._ended

    def inventory_read(self, requested: float) -> None:
        """The inventory now in hand was requested at ``requested`` (this
        clock's time): the operations that ended before then are in it."""
        self._ended = {d: t for d, t in self._ended.items() if t >= requested}

    # -- a count-based manager's answer ------------------------------------

    @contextmanager
    def asking(self, node: str) -> Iterator[None]:
        """A scale-up for ``node`` is asked, and what arrived recorded, inside."""
        self._asking[node] += 1
        try:
            yield
        finally:
            self._asking[node] -= 1
            if not self._asking[node]:
                del self._asking[node]

    def scaling_up(self, node: str) -> bool:
        """Whether a device attached to ``node`` may be the answer of a scale-up
        not recorded yet (and so be some allocation's or spare's)."""
        return node in self._asking
