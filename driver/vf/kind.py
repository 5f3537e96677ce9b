"""SR-IOV VFs as a :class:`driver.devices.kind.DeviceType`.

Why this module exists: it ties the VF family together for the plugin. Each
scan first brings every selected PF to its configured VF count, then lists
the VFs of the selected PFs. A PF already at its count is left alone, so
repeated scans never recreate VFs that claims may hold; the kernel refuses
to change a non-zero count to another non-zero one, so a change goes
through zero first. A PF whose VF count cannot be set is logged and offered
with the VFs it has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.errors import DeviceError
from driver.pci.writes import wait_until, write_attr
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import PhysFn, physical_functions, scan, virtual_functions
from driver.vf.prepare import VfHandler

log = logging.getLogger(__name__)


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
    ) -> None:
        self._config = config
        self._always = always
        self._sysfs = sysfs_root
        self._handler = VfHandler(sysfs_root, dev_root)

    def configure_pfs(self) -> int:
        """Apply ``numVfs`` of the selected PFs; how many PFs changed."""
        changed = 0
        for pf in physical_functions(self._sysfs):
            selector = self._config.select(pf.netdev, pf.bdf, pf.vendor, pf.device)
            if selector is None or selector.num_vfs is None:
                continue
            try:
                changed += ensure_num_vfs(pf, selector.num_vfs)
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
