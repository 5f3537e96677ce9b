"""Set the number of VFs of a PF (``sriov_numvfs``).

Why this module exists: the kernel refuses to change a non-zero VF count to
another non-zero count, so a change goes through zero first; and the new VFs
must exist before discovery reads them. A PF already at the wanted count is
left alone, so repeated scans never recreate VFs that claims may hold.
"""

from __future__ import annotations

import logging

from driver.errors import DeviceError
from driver.vf.discovery import PhysFn, virtual_functions
from driver.vf.writes import wait_until, write_attr

log = logging.getLogger(__name__)


def ensure_num_vfs(pf: PhysFn, wanted: int, timeout: float = 10.0) -> bool:
    """Make ``pf`` have ``wanted`` VFs; True when it changed anything."""
    current = len(virtual_functions(pf))
    if pf.num_vfs == wanted and current == wanted:
        return False
    if wanted > pf.total_vfs:
        raise DeviceError(
            f"PF {pf.bdf}: numVfs {wanted} exceeds sriov_totalvfs {pf.total_vfs}"
        )
    control = pf.path / "sriov_numvfs"
    log.info("PF %s (%s): setting VFs %d -> %d", pf.bdf, pf.netdev, current, wanted)
    if current or pf.num_vfs:
        write_attr(control, "0")
        wait_until(f"PF {pf.bdf} to drop its VFs", lambda: not virtual_functions(pf), timeout)
    if wanted:
        write_attr(control, str(wanted))
        wait_until(
            f"PF {pf.bdf} to create {wanted} VFs",
            lambda: len(virtual_functions(pf)) == wanted,
            timeout,
        )
    return True
