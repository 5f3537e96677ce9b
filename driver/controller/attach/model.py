"""What an attach is for a fabric's pool shape: the :class:`AttachModel` protocol.

Why a module: the workers (``driver.controller.attach.workers``) decide
which operation runs on which device and what its outcome writes; how a
claim's or a spare's device gets attached differs with the pool's shape
(``driver.controller.pool.model``). A manager that attaches the device it
is asked for is asked for the variant's device
(``driver.controller.attach.device_attach``); a count-based manager is
asked for one device of a slot's model and the attach follows the one it
chose (``driver.controller.attach.slot_attach``). The workers hold one
model and never ask which.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from driver.controller import claims as cl
from driver.controller.pool.variant import Variant


class AttachModel(Protocol):
    async def attach(
        self,
        a: cl.FabricAllocation,
        v: Variant,
        deadline: float,
        served: str,
        arrived: Callable[[str], Awaitable[None]],
    ) -> tuple[str, dict[str, str]]:
        """Attach for allocation ``a`` of ``v`` by ``deadline`` (monotonic) until
        its node reports the device; (the message of its Attached Event, the
        claim's device status data). ``served``: the device the allocation
        already holds ("" if none); ``arrived(device)`` runs as soon as a
        manager that picks the device named it. Raises ``AttachFailed`` or a
        fabric error."""
        ...

    async def attach_spare(
        self, a: cl.FabricAllocation, v: Variant, deadline: float, arrived: Callable[[str], None]
    ) -> tuple[Variant, float]:
        """Ask for ``v``'s device as a warm spare (``a``: a key of its own);
        the variant that is attached (a count-based manager's choice) and the
        deadline, moved on by the time the fabric was unusable. The caller
        waits for the node to report it."""
        ...

    def failure_data(self, v: Variant) -> dict[str, str] | None:
        """The claim's device status data after a failed attach of ``v``
        (None: left as it is)."""
        ...
