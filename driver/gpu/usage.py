"""Whether NVML shows a GPU in use: a MIG instance on it, or a process.

Why: a claim is not the only thing that holds a GPU. A MIG instance can
outlive its claim (an unprepare that did not finish, one an operator made),
and a process can hold the device (a container still exiting after its pod
was force-deleted, someone debugging on the node). A real host does not
refuse to hot-remove such a GPU (the demo logged XID 79, then the remove),
so before a fabric GPU leaves the node the plugin asks NVML itself and
reports the GPU busy (``driver.fabric_devices.usage``, issue 34).

Blocking: one NVML session per probe, under the MIG session lock when there
is one (no probe sees a MIG change halfway); callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection

from driver.errors import NvmlError
from driver.nvml.backend import NvmlBackend, NvmlReturn

log = logging.getLogger(__name__)

# The GPU has left NVML (detached, lost): nothing on it can be in use any more.
_GONE = (NvmlReturn.NOT_FOUND, NvmlReturn.GPU_IS_LOST)


def why_in_use(nvml: NvmlBackend, uuid: str) -> str | None:
    """Why ``uuid`` is in use (NVML initialised), None when nothing holds it.

    A query NVML does not answer (other than for a GPU that is gone) counts
    as in use: a wrong "free" pulls a GPU from under a process, a wrong
    "busy" only delays a detach until the next probe.
    """
    try:
        instances = {i.gi_id for i in nvml.mig_instances(uuid)}
        pids = nvml.running_processes(uuid)
    except NvmlError as exc:
        if exc.code in _GONE:
            return None
        log.warning("GPU %s: NVML cannot say whether it is in use (%s): counted busy", uuid, exc)
        return f"NVML: {exc}"
    if instances:
        return f"{len(instances)} MIG instances exist on it"
    if pids:
        return f"processes {', '.join(map(str, pids))} run on it"
    return None


def gpus_in_use(
    nvml: NvmlBackend, lock: threading.RLock | None, uuids: Collection[str]
) -> dict[str, str]:
    """UUID -> why, for each GPU of ``uuids`` NVML shows in use."""
    if not uuids:
        return {}
    out: dict[str, str] = {}
    with lock if lock is not None else contextlib.nullcontext():
        try:
            nvml.init()
        except NvmlError as exc:
            log.warning("NVML unavailable, fabric GPUs %s counted busy: %s", sorted(uuids), exc)
            return {u: f"NVML unavailable: {exc}" for u in uuids}
        try:
            for uuid in uuids:
                why = why_in_use(nvml, uuid)
                if why is not None:
                    out[uuid] = why
        finally:
            nvml.shutdown()
    return out
