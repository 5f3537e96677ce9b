"""A shared GPU's utilization per claim: NVML's process samples mapped to pods.

Why: the whole GPU's rate cannot tell one claim's share from another's, so
with it one busy share kept every share of its GPU from being idle (issue
37, "Shared GPUs: per process, mapped to claims where that can be told").
NVML names processes by PID (``nvmlDeviceGetProcessUtilization``); the
kubelet puts each container in a cgroup whose path names its pod's UID, in
the cgroupfs driver's spelling (``/kubepods/burstable/pod<uid>/<id>``) or
the systemd driver's (``.../kubepods-burstable-pod<uid_with_underscores>.slice/
cri-containerd-<id>.scope``); a claim's pods are the UIDs its
``status.reservedFor`` named at prepare (``ClaimRecord.pods``).

A share's reading is the sum of its pods' processes' SM utilization (the
busiest sample of each process; none running: 0), at most 100. A process
at 0 % needs no owner. A busy one that cannot be mapped (its
``/proc/<pid>/cgroup`` unreadable: gone, or not in the plugin's PID
namespace; no pod in its path; a pod no share of this GPU holds) leaves the
round to the whole GPU's rate (:func:`read_shares` answers None): never
idle on a guess, and idle only when the whole GPU is, as before.

Limits: NVML's PIDs are the host's, so the plugin must see the host's
``/proc`` (``hostPID``) for any busy process to be mapped; a PID reused
between the sample and the read is taken for its new process.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from pathlib import Path

from driver.idle.sources import Source
from driver.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
POD_IN_CGROUP = re.compile(rf"kubepods\S*?pod({_UID})")


def pod_of(proc_root: Path, pid: int) -> str | None:
    """The UID of the pod process ``pid`` runs in; None when it cannot be told."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        match = POD_IN_CGROUP.search(line.split(":", 2)[-1])
        if match:
            return match.group(1).replace("_", "-")
    return None


def read_shares(
    nvml: NvmlBackend, gpu: str, shares: Collection[Source], proc_root: Path
) -> dict[Source, float] | None:
    """Percent per share of ``gpu`` (each with its ``pods``); None when a busy
    process cannot be mapped to one. NVML errors (NOT_SUPPORTED among
    them) go to the caller."""
    busiest: dict[int, int] = {}
    for sample in nvml.process_utilization(gpu):
        busiest[sample.pid] = max(busiest.get(sample.pid, 0), sample.sm)
    owners: dict[str, list[Source]] = {}
    for share in shares:
        for uid in share.pods or ():
            owners.setdefault(uid, []).append(share)
    out = dict.fromkeys(shares, 0.0)
    for pid, sm in sorted(busiest.items()):
        if sm <= 0:
            continue
        pod = pod_of(proc_root, pid)
        held = owners.get(pod) if pod is not None else None
        if not held:
            log.debug("GPU %s: process %d (pod %s) is no share's: the whole GPU's rate",
                      gpu, pid, pod)  # fmt: skip
            return None
        for share in held:  # a pod holding two shares of the GPU: both
            out[share] = min(100.0, out[share] + sm)
    return out
