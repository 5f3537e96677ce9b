"""The three kinds of fabric trouble an attach meets, told apart (issue 35).

Why a module: what the controller does about a fabric error depends on
whose fault it is, and the operator must see which it was. Holding a
healthy device out of the pool because the manager was briefly down, or
because another resource answered 500, costs capacity and tells the
operator nothing true. The workers (``driver.controller.attach.workers``)
and the attach retry loop (``driver.controller.attach.connect``) ask
:func:`case_of` and act on the answer; the case is the reason of the
claim's Event and of its ``FabricDeviceFailed`` condition:

- ``FabricUnreachable``: the manager did not answer (connection, timeout,
  TLS, a redirect away from it) or answered about the whole service (401,
  403, 429, 503). Nothing is known to be wrong with the device: the attach
  is retried with backoff, an Event per new error; after
  ``fabric_unreachable_budget`` seconds in a row the claim fails and the
  device is NOT held.
- ``FabricResourceBroken``: one resource could not be used (an answer of
  5xx, a body of the wrong shape, cut short or over the size limit, a
  device the read held back because its endpoint or a binding is
  unreadable). Handled as unreachable: retried (the resource may heal),
  never held; attaches of devices it does not touch go on (the client's
  reads keep what they could read).
- ``FabricAttachRefused``: the manager refused the attach request (4xx;
  409 when another host or tenant has the device) or the client would not
  send it. The claim fails at once and the device is held out of the pool
  for ``failed_device_hold``: offered again, it would fail the next claim
  the same way.

``FabricAdapterFull``: the adapter the attach would go through has no room
(``driver.controller.pool.room``). Nothing is asked of the fabric; the claim
fails at once and the device is NOT held (it is not at fault): the
scheduler places the claim again, on a node with room.

Anything else is ``AttachFailed``: the fabric accepted the attach and it
failed (its task ended badly), the node never reported the device, no
attach within ``attach_timeout``, a count-based manager sent the wrong
device. The device is held, as for a refusal. An ``AttachFailed`` raised
*from* a fabric error (the retry budget spent) is that error's case.
"""

from __future__ import annotations

from driver.controller import events
from driver.errors import (
    AdapterFull,
    AttachFailed,
    CountAttachFailed,
    FabricApiError,
    FabricAttachRefused,
    FabricResourceBroken,
    FabricUnavailable,
)
from driver.fabricclient.links import WHOLE_SERVICE  # about the service, not one resource

UNREACHABLE = events.FABRIC_UNREACHABLE
BROKEN = events.FABRIC_RESOURCE_BROKEN
REFUSED = events.FABRIC_ATTACH_REFUSED
FAILED = events.ATTACH_FAILED
FULL = events.ADAPTER_FULL

# What each case means to the operator (the start of its Event's note).
MEANING = {
    UNREACHABLE: "the fabric manager is unreachable or unavailable (expected it to answer)",
    BROKEN: "a fabric resource the attach needs is broken (expected a success answer of the "
    "right shape)",
    REFUSED: "the fabric refused the attach (expected it accepted)",
    FAILED: "the attach failed",
    FULL: "the node's fabric adapter has no room for the device (expected a free slot)",
}


def case_of(exc: BaseException) -> str:
    """The case of ``exc`` (one of the module's five names)."""
    if isinstance(exc, AdapterFull):
        return FULL
    if isinstance(exc, AttachFailed) and isinstance(exc.__cause__, Exception):
        return case_of(exc.__cause__)
    if isinstance(exc, FabricResourceBroken):
        return BROKEN
    if isinstance(exc, FabricUnavailable):
        return UNREACHABLE
    if isinstance(exc, FabricAttachRefused):
        return REFUSED
    if isinstance(exc, FabricApiError) and not isinstance(exc, CountAttachFailed):
        if exc.status in WHOLE_SERVICE:
            return UNREACHABLE
        if exc.status >= 500:
            return BROKEN
        if exc.status >= 400:
            return REFUSED  # 409 (another host or tenant has it), 404 (not reachable there)
    return FAILED


def retried(case: str) -> bool:
    """Whether an attach waits out an error of ``case`` (within its budget)."""
    return case in (UNREACHABLE, BROKEN)


def holds(case: str) -> bool:
    """Whether a failure of ``case`` holds the device out of the pool."""
    return not retried(case) and case != FULL
