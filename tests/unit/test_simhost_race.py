"""A NIC hot-added while its VFs are reconfigured, many times (issue 33).

Three parties act on one simulated host, as in the fabric e2e tier: the
fabric service hot-adds and hot-removes a NIC (a process of its own here
too), the sysfs effects watcher applies writes (a thread of this process),
and a node-side writer sets the PF's VF count through zero (what the plugin
did to a NIC it found half-built). Before the host lock and the one-step
add, the effects step removed VFs that ``hot_add`` was still reading
(``FileNotFoundError`` on a VF's ``vendor``) and left functions behind.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES

REPO = Path(__file__).resolve().parents[2]
CYCLES = 50
BDF = "0000:86:00.0"

# The fabric side: hot-add and hot-remove the NIC, CYCLES times, in a process
# of its own (the host lock must hold across processes, not only threads).
FABRIC_SIDE = """
import sys
from pathlib import Path
from fabric.simhost.host import SimHost
from fabric.simhost.topology import Nic
directory, bdf, cycles = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(cycles):
    host = SimHost.open(directory)
    added = host.hot_add("adapter1", Nic(bdf, "fab0f0", total_vfs=4, num_vfs=4))
    gone = SimHost.open(directory).hot_remove(bdf)
    assert bdf in added and bdf in gone, (added, gone)
    print("cycle", i, flush=True)
"""


def _reconfigure(host: SimHost, stop: threading.Event) -> None:
    """The node side: give the PF 4 VFs through zero whenever it has another
    count, as fast as it can (before the fix, 4 runs in 4 failed at 50 cycles)."""
    pf = host.tree.bus_devices / BDF
    while not stop.is_set():
        try:
            have = len(list(pf.glob("virtfn*")))
            wanted = (pf / "sriov_numvfs").read_text().strip()
            if have != 4:
                (pf / "sriov_numvfs").write_text("0\n" if have or wanted != "0" else "4\n")
        except (FileNotFoundError, NotADirectoryError):
            pass  # not there (yet, or any more)


def test_nic_hot_added_while_its_vfs_are_reconfigured(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "node")
    stop = threading.Event()
    writer = threading.Thread(target=_reconfigure, args=(host, stop), daemon=True)
    with host.effects_watcher(safety_s=0.01):
        writer.start()
        try:
            fabric = subprocess.run(
                [sys.executable, "-c", FABRIC_SIDE, str(host.dir), BDF, str(CYCLES)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            stop.set()
            writer.join()
    assert fabric.returncode == 0, fabric.stderr[-3000:]
    assert fabric.stdout.count("cycle") == CYCLES
    host.process_writes()
    # Nothing of the NIC is left: no function, no driver link, no IOMMU group.
    port = host.tree.path_of(str(host.adapters["adapter1"][0]))
    assert [p.name for p in port.iterdir() if p.name.startswith("0000:")] == []
    assert sorted(p.name for p in host.tree.bus_devices.iterdir() if p.name[5:7] == "86") == []
    dangling = [p for p in host.tree.groups.rglob("*") if p.is_symlink() and not p.exists()]
    assert dangling == []
