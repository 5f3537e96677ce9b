"""The words that say a fabric device is held after a failed attach.

Why: the controller keeps a device whose attach was refused or failed out
of the pool for ``failedDeviceHold`` seconds (``driver.controller.attach
.holds``), in its memory only. In the per-node shape the pool still counts
the device in its counter sets; in the per-domain shape it is published
nowhere, so what a read-only user can see of the hold is the failure's
text: the controller's Warning on the claim (``AttachFailed``,
``FabricAttachRefused``) or on the Node (``SpareAttachFailed``), and the
claim's ``FabricDeviceFailed`` message, which the scheduler repeats in its
``FailedScheduling`` Warning on the pod. Each ends in :func:`held_for`'s
words, naming the device and the hold's length; ``kubectl patchbay
fabric`` reads them back with :func:`hold_in` (the Event's time plus the
length: until when). One place writes and reads them. Pure functions.
"""

from __future__ import annotations

import re

_WORDS = re.compile(r"(?<!\S)(\S+) is held out of the pool for ([0-9][0-9.e+]*)s\b")


def held_for(device_id: str, seconds: float) -> str:
    """``gpu-1 is held out of the pool for 600s``."""
    return f"{device_id} is held out of the pool for {seconds:g}s"


def hold_in(message: str) -> tuple[str, float] | None:
    """(device id, seconds) of the last :func:`held_for` words in ``message``, or None."""
    found = _WORDS.findall(message)
    if not found:
        return None
    device, seconds = found[-1]
    try:
        return device, float(seconds)
    except ValueError:
        return None
