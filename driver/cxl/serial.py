"""The serial of a CXL device, in the one form patchbay compares it in.

Why this module exists: the same serial reaches patchbay in three spellings,
Linux's ``/sys/bus/cxl/devices/memX/serial`` (``0x`` and hex without leading
zeros, as ``%#llx`` prints it), a Redfish ``GCXLID`` (an EUI-64 in dash-separated
bytes, then ``:`` and the logical device id) and a plain number; variant names
and the Node annotation need one. Linux's form is it, so a person can compare
it with what the node shows.
"""

from __future__ import annotations

import re

_HEX64 = re.compile(r"^(0x)?[0-9a-f]{1,16}$")
_EUI64 = re.compile(r"^[0-9a-f]{2}(-[0-9a-f]{2}){7}$")


def cxl_identity(serial: str | int) -> str:
    """A CXL device serial as Linux prints ``/sys/bus/cxl/devices/memX/serial``:
    ``0x`` and lowercase hex without leading zeros (``0x4c1d96fffeddd835``).

    Accepts that form, a Redfish GCXLID or its serial part
    (``4C-1D-96-FF-FE-DD-D8-35:0001``: the logical device id after the colon
    is dropped), or the number itself; anything else is a ``ValueError``.
    """
    if isinstance(serial, int):
        if not 0 <= serial < 1 << 64:
            raise ValueError(f"CXL serial {serial} is not a 64-bit number")
        return f"{serial:#x}"
    text = serial.strip().lower().split(":")[0]
    if _EUI64.match(text):
        return f"{int(text.replace('-', ''), 16):#x}"
    if _HEX64.match(text):
        return f"{int(text, 16):#x}"
    raise ValueError(f"CXL serial {serial!r} is neither 0x<hex> nor an EUI-64 (GCXLID)")
