"""Reading the utilization of the prepared devices through NVML.

Why: the readings block (NVML), need one session per round and, for a MIG
device, state between rounds: GPM gives a GPU instance's SM utilization
only between two samples, so the sampler keeps each instance's last sample
and reads the mean since then (the first round of a MIG device gives no
reading yet). A whole GPU answers its recent rate at once. A device NVML
cannot read this round (NOT_SUPPORTED, the GPU lost, NVML down) reads None:
unknown, which is never idle. A share with known pods reads its processes
(``driver.idle.shares``), once per GPU and round for all its shares; where
NVML has no per-process samples (NOT_SUPPORTED) or a busy process cannot be
mapped, the whole GPU's rate.

Blocking: one NVML session per round, under the MIG session lock when
there is one (no reading sees a MIG change halfway); callers run
:meth:`UtilizationSampler.read` in a worker thread, one round at a time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection
from pathlib import Path

from driver.errors import NvmlError
from driver.idle.shares import read_shares
from driver.idle.sources import Source
from driver.nvml.backend import GpmSample, NvmlBackend, NvmlReturn

log = logging.getLogger(__name__)


class UtilizationSampler:
    def __init__(
        self,
        nvml: NvmlBackend,
        lock: threading.RLock | None = None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self._nvml = nvml
        self._lock = lock
        self._proc = proc_root  # where a process's cgroup names its pod
        # This round's shares per GPU: readings, None (the whole GPU's rate), or the error
        self._round: dict[str, dict[Source, float] | NvmlError | None] = {}
        self._sources: Collection[Source] = ()
        self._gpm: dict[Source, GpmSample] = {}  # each MIG instance's last sample
        self._failing: set[Source] = set()  # logged once until it reads again
        self._nvml_down = False  # logged once until NVML initialises again

    def read(self, sources: Collection[Source]) -> dict[Source, float | None]:
        """Percent per source; None: unknown now. A MIG device's first round
        is left out (one GPM sample is no reading yet)."""
        with self._lock if self._lock is not None else contextlib.nullcontext():
            try:
                self._nvml.init()
            except NvmlError as exc:
                if not self._nvml_down:
                    log.warning("NVML unavailable: utilization of %d devices unknown: %s",
                                len(sources), exc)  # fmt: skip
                self._nvml_down = True
                return dict.fromkeys(sources)
            self._nvml_down = False
            self._round, self._sources = {}, sources
            try:
                out: dict[Source, float | None] = {}
                for source in sources:
                    reading, value = self._read_one(source)
                    if reading:
                        out[source] = value
                for gone in self._gpm.keys() - set(sources):
                    self._close(self._gpm.pop(gone))
                return out
            finally:
                self._round, self._sources = {}, ()
                self._nvml.shutdown()

    def _read_one(self, source: Source) -> tuple[bool, float | None]:
        """(whether there is a reading, percent or None for unknown)."""
        try:
            value = self._measure(source)
        except NvmlError as exc:
            old = self._gpm.pop(source, None)
            if old is not None:
                self._close(old)
            if source not in self._failing:
                log.warning("utilization of %s unknown: %s", _name(source), exc)
            self._failing.add(source)
            return True, None
        if value is None:
            return False, None  # a MIG device's first GPM sample
        if source in self._failing:
            log.info("utilization of %s readable again", _name(source))
            self._failing.discard(source)
        return True, value

    def _measure(self, source: Source) -> float | None:
        """Percent; None for a MIG device's first sample (no reading yet)."""
        if source.pods is not None:
            shares = self._shares(source.gpu)
            if shares is not None:
                return shares[source]
        if source.gi_id is None:
            return float(self._nvml.utilization(source.gpu))
        new = self._nvml.mig_sample(source.gpu, source.gi_id)
        old = self._gpm.get(source)
        self._gpm[source] = new
        if old is None:
            return None
        try:
            return self._nvml.mig_utilization(old, new)
        finally:
            self._close(old)

    def _shares(self, gpu: str) -> dict[Source, float] | None:
        """This round's readings of ``gpu``'s shares; None: the whole GPU's rate."""
        if gpu not in self._round:
            shares = [s for s in self._sources if s.gpu == gpu and s.pods is not None]
            try:
                self._round[gpu] = read_shares(self._nvml, gpu, shares, self._proc)
            except NvmlError as exc:
                supported = exc.code != NvmlReturn.NOT_SUPPORTED
                self._round[gpu] = exc if supported else None
        got = self._round[gpu]
        if isinstance(got, NvmlError):
            raise got
        return got

    def close(self) -> None:
        """Free the samples kept (NVML allocated them)."""
        for sample in self._gpm.values():
            self._close(sample)
        self._gpm.clear()

    @staticmethod
    def _close(sample: GpmSample) -> None:
        try:
            sample.close()
        except NvmlError as exc:
            log.debug("freeing a GPM sample: %s", exc)


def _name(source: Source) -> str:
    return source.gpu if source.gi_id is None else f"{source.gpu} GI {source.gi_id}"
