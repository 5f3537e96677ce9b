"""An event for the scheduler once it lets go of an allocation nobody waits for.

Why a module: the 1.37 scheduler keeps a claim's allocation "in flight"
(``dynamicresources`` plugin, ``claimTracker.inFlightAllocations``) from
Reserve until PreBind ends. With binding conditions PreBind waits for them,
polling every 5 s (hard-coded); ``prebindSuccessCleanup`` drops the entry
only on success, ``Unreserve`` on failure. A pod deleted while PreBind
waits (its generated claim then deallocated and deleted) keeps its device
in flight until that poll finds the claim gone, up to 5 s later, and the
device looks taken to every pod tried meanwhile: "cannot allocate all
claims". Dropping the entry (``Unreserve`` after the failed PreBind)
raises no event those pods' queueing hints accept: the binding cycle's
error moves pods for ``EventAssignedPodDelete`` only, which the plugin does
not register (``DynamicResources.EventsToRegister``), and the claim's own
deallocation and deletion came earlier and were spent on a try that still
saw the device in flight. They wait for the queue's five-minute flush
(seen in the race e2e: a loser's pod deleted just as the winner's claim
freed gpu-0, its allocation written all the same).

So when a claim whose fabric allocation was never ready (its PreBind was
waiting) is deleted, the controller writes that allocation's pool once
more, as it is, after the scheduler's poll must have let go
(:data:`PREBIND_POLL_S` plus :data:`MARGIN_S`): a ResourceSlice update,
which the plugin registers without a hint, moves every pod it rejected
back to the active queue. One write per abandoned allocation; nothing
otherwise. Allocations are learnt from every watch event of a claim
(:meth:`Requeue.seen`), since such a one lives a few milliseconds;
deletions from the passes. A claim deallocated and kept (not generated
for its pod) stays in flight until the scheduler's binding timeout;
nothing short of that frees it.

Concurrency: called from the claims watch and the reconciler's pass on
the event loop; the delayed write is a ``call_later`` callback on it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from driver.controller import claims as cl

log = logging.getLogger(__name__)

PREBIND_POLL_S = 5.0  # the 1.37 scheduler's PreBind poll of binding conditions
MARGIN_S = PREBIND_POLL_S  # the scheduler may see the deletion later than we do

Later = Callable[[float, Callable[[], None]], Any]


def _call_later(delay: float, callback: Callable[[], None]) -> Any:
    return asyncio.get_running_loop().call_later(delay, callback)


class Requeue:
    """Renews an abandoned allocation's pool once its claim is gone."""

    def __init__(
        self,
        fabric_pool: str,
        renew: Callable[[str | None], bool],
        delay: float = PREBIND_POLL_S + MARGIN_S,
        later: Later = _call_later,
    ) -> None:
        self._fabric_pool = fabric_pool
        self._renew = renew
        self._delay = delay
        self.later = later  # the loop's call_later (tests inject their own)
        self._waiting: dict[str, str] = {}  # claim UID -> pool of its unready allocation

    def seen(self, kind: str, claim: Mapping[str, Any]) -> None:
        """Each watch event of a claim: an allocation the scheduler writes and
        the claim controller takes back a moment later may never be in the
        cache when a pass looks."""
        if kind != "DELETED":
            self._track(cl.fabric_allocations(claim, self._fabric_pool))

    def note(
        self, allocs: Iterable[cl.FabricAllocation], claims: Iterable[Mapping[str, Any]]
    ) -> None:
        """One pass: ``allocs`` as now, among ``claims`` (every claim there is)."""
        self._track(allocs)
        uids = {str((c.get("metadata") or {}).get("uid") or "") for c in claims}
        for uid, pool in list(self._waiting.items()):
            if uid not in uids:
                del self._waiting[uid]
                log.info("claim %s was deleted before its fabric device was ready: pool %s is"
                         " renewed in %.0fs for the scheduler", uid, pool, self._delay)  # fmt: skip
                self.later(self._delay, functools.partial(self._fire, pool))

    def _track(self, allocs: Iterable[cl.FabricAllocation]) -> None:
        for a in allocs:
            if a.ready or a.failed or not a.waits:  # no PreBind wait (any more)
                self._waiting.pop(a.claim_uid, None)
            else:
                self._waiting[a.claim_uid] = a.pool

    def _fire(self, pool: str) -> None:
        if not self._renew(pool) and not self._renew(None):
            log.debug("no fabric pool to renew for the scheduler (pool %s)", pool)
