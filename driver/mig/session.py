"""One lock around every NVML conversation of the plugin.

Discovery (hot-plug rescans) and claim preparation run in different worker
threads, and both initialise and shut down NVML around their work. NVML's
own reference count would let one thread's shutdown pull the library from
under the other's MIG change, and a scan taken halfway through a GI/CI
creation would publish a geometry that never existed. So every user of the
backend opens it through :class:`NvmlSession`: the lock is re-entrant, so a
discovery holding it may open nested sessions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from driver.nvml.backend import GpuInfo, NvmlBackend

log = logging.getLogger(__name__)


class NvmlSession:
    """Serialised access to one :class:`NvmlBackend`."""

    def __init__(self, backend: NvmlBackend) -> None:
        self.backend = backend
        self.lock = threading.RLock()

    @contextmanager
    def open(self) -> Iterator[NvmlBackend]:
        """NVML initialised for the duration of the block, under the lock."""
        with self.lock:
            self.backend.init()
            try:
                yield self.backend
            finally:
                self.backend.shutdown()


def find_gpu(nvml: NvmlBackend, uuid: str) -> GpuInfo | None:
    """The GPU with ``uuid`` as NVML reports it now, or None when it is gone:
    one lookup by UUID, not an enumeration of every GPU."""
    return nvml.gpu(uuid)


def toggles_mig_mode(gpu: GpuInfo) -> bool:
    """Whether we may switch MIG mode ourselves: Hopper and newer apply it at
    once; Ampere needs a GPU reset, so only an operator changes it there."""
    return gpu.mig_capable and gpu.architecture not in ("ampere",)
