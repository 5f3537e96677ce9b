"""SR-IOV VFs as a :class:`driver.devices.kind.DeviceType`.

Why this module exists: it ties the VF family together for the plugin. Each
scan first brings every selected PF to its configured VF count, then lists
the VFs of the selected PFs. A PF already at its count is left alone, so
repeated scans never recreate VFs that claims may hold; the kernel refuses
to change a non-zero count to another non-zero one, so a change goes
through zero first. A PF whose VF count cannot be set is logged and offered
with the VFs it has. A PF still arriving (hot-added, its ``add`` event not
yet processed: :mod:`driver.pci.arrivals`) is listed but not changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.errors import DeviceError
from driver.pci.arrivals import Arrivals
from driver.pci.writes import wait_until, write_attr
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import PhysFn, physical_functions, scan, virtual_functions
from driver.vf.prepare import VfHandler

log = logging.getLogger(__name__)

# VFs a fabric-attached NIC gets when no PF selector names a count.
FABRIC_NIC_VFS = 1


def ensure_num_vfs(pf: PhysFn, wanted: int, timeout: float = 10.0) -> bool:
    """Make ``pf`` have ``wanted`` VFs (through zero); True when it changed."""
    current = len(virtual_functions(pf))
    if pf.num_vfs == wanted and current == wanted:
        return False
    if wanted > pf.total_vfs:
        raise DeviceError(f"PF {pf.bdf}: numVfs {wanted} exceeds sriov_totalvfs {pf.total_vfs}")
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


class VfType:
    """SR-IOV VFs of the PFs the pool config selects, plus (``always``) those of
    PFs the caller names by address: NICs a fabric attached to this node."""

    def __init__(
        self,
        config: PfPoolConfig,
        sysfs_root: Path,
        dev_root: Path,
        always: Callable[[str], bool] | None = None,
        arrivals: Arrivals | None = None,
    ) -> None:
        self._config = config
        self._always = always
        self.arrivals = arrivals or Arrivals(tracking=False)
        self._sysfs = sysfs_root
        self._handler = VfHandler(sysfs_root, dev_root)

    def wanted_vfs(self, pf: PhysFn) -> int | None:
        """How many VFs ``pf`` should have; None: leave it as it is. A NIC
        the fabric attached arrives with none (as a real PF does): without a
        selector's ``numVfs`` it gets one, the VF its fabric claim uses."""
        selector = self._config.select(pf.netdev, pf.bdf, pf.vendor, pf.device)
        if selector is not None and selector.num_vfs is not None:
            return selector.num_vfs
        if self._always is not None and self._always(pf.bdf):
            return max(pf.num_vfs, FABRIC_NIC_VFS)
        return None

    def configure_pfs(self) -> int:
        """Apply ``numVfs`` of the selected PFs that have finished arriving;
        how many PFs changed."""
        changed = 0
        pfs = physical_functions(self._sysfs)
        settled = self.arrivals.settled(pf.bdf for pf in pfs)
        for pf in pfs:
            wanted = self.wanted_vfs(pf)
            if wanted is None:
                continue
            if pf.bdf not in settled:
                log.info("PF %s: still arriving (no add event yet); its VFs wait", pf.bdf)
                continue
            try:
                changed += ensure_num_vfs(pf, wanted)
            except DeviceError as exc:
                log.error("PF %s: %s", pf.bdf, exc)
        return changed

    def discover(self) -> Discovery:
        if not self._config.pfs and self._always is None:
            return Discovery()
        self.configure_pfs()
        return scan(self._sysfs, self._config, self._always)

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {"vf": self._handler}
