"""The side effects real sysfs files have, applied to the simulated tree.

Writing ``<bdf>`` to ``bus/pci/drivers/<drv>/unbind`` detaches a device,
writing it to ``.../bind`` or to ``bus/pci/drivers_probe`` attaches one
(``drivers_probe`` honours the device's ``driver_override``, else picks the
device's native driver), writing N to a PF's ``sriov_numvfs`` makes it have
N VFs (created bound to the PF's driver, or removed from the top). A plain
directory cannot react to writes, so the simulated host applies them in a
separate step: :meth:`SysfsEffects.apply` scans the write-only files,
performs what the kernel would (unbind first, then bind, then probe, then VF
counts), and remembers how far it read each (:class:`CommandFiles`).
``on_driver_change(bdf, driver)`` hears each binding change (``driver``
None: unbound), so the host can keep what depends on it in step (NVML lists
a GPU only while NVIDIA's driver has it), in the kernel's order: a driver's
probe before the ``driver`` link appears, its remove before the link goes. A
writer that waits for the link then finds NVML in step too (a GPU given back
from ``vfio-pci`` was once checked in NVML between the link and the probe:
issue 33).

Two ways to run it, both used: call ``apply()`` (``SimHost.process_writes``)
right after in-process code writes, or run :class:`EffectsWatcher`, a thread
that applies pending writes for a plugin in another process. The watcher
sleeps on inotify over the directories that hold the write-only files (each
driver's, ``bus/pci``, each PF's, and the driver and device lists for new
ones) and applies when one is written: it used to scan every 5 ms, about
16 % of a core per simulated host (each real-node and kind node runs one),
taken from the cluster under test. A pass every ``safety_s`` (default 1 s)
still runs, for a write in a directory that appeared between two passes.
Either way the effect is asynchronous to the writer, so driver code
should write and then wait for the ``driver`` link to change (on a real
kernel that wait ends at once).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from driver.pci.filewatch import DirWatch
from fabric.simhost.sysfs_tree import SysfsTree

log = logging.getLogger(__name__)


_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


class CommandFiles:
    """What was written to the tree's command files since the last pass.

    Writers append one request per line (``driver.pci.writes.write_command``)
    and a file is never emptied: emptying it after reading lost a request
    written in between, and two writers truncating it lost one of theirs. How
    far each file was read is kept in the tree (``.effects/``), so a request
    that lands during a pass is read by the next and a restarted effects
    process does not act on old ones. A last line without its newline is
    taken only when it is a whole BDF (a write still landing is not)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._marks = root / ".effects"

    def take(self, path: Path) -> list[str]:
        mark = self._marks / path.relative_to(self.root).as_posix().replace("/", "%")
        try:
            start = int(mark.read_text())
        except (FileNotFoundError, ValueError):
            start = 0
        try:
            with path.open("rb") as f:
                if f.seek(0, 2) < start:  # emptied by someone: from the start
                    start = 0
                f.seek(start)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # whole lines; a last one only if a whole BDF
        if _BDF.fullmatch(data[end:].decode(errors="replace").strip()):
            end = len(data)
        if not end:
            return []
        self._marks.mkdir(exist_ok=True)
        mark.write_text(str(start + end))
        return [line.strip() for line in data[:end].decode().splitlines() if line.strip()]


class SysfsEffects:
    def __init__(
        self,
        tree: SysfsTree,
        native_driver: Callable[[str], str | None],
        on_driver_change: Callable[[str, str | None], None] | None = None,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        self.tree = tree
        self.native_driver = native_driver
        self.on_driver_change = on_driver_change
        # The host's lock (hostlock.py): a hot-add or hot-remove in another
        # process never meets a pass half-way.
        self._lock: AbstractContextManager[object] = lock or threading.Lock()
        self._commands = CommandFiles(tree.root)

    def _override(self, bdf: str) -> str | None:
        try:
            value = (self.tree.bus_devices / bdf / "driver_override").read_text().strip()
        except FileNotFoundError:
            return None
        return None if value in ("", "(null)") else value

    def apply(self) -> int:
        """Apply every pending write; returns how many took effect."""
        with self._lock:
            done = 0
            drivers = sorted(p for p in self.tree.drivers.iterdir() if p.is_dir())
            for d in drivers:
                for bdf in self._commands.take(d / "unbind"):
                    if self.tree.exists(bdf) and self.tree.driver_of(bdf) == d.name:
                        self._changed(bdf, None)  # the driver's remove, then the link
                        self.tree.unbind(bdf)
                        log.info("sysfs: %s unbound from %s", bdf, d.name)
                        done += 1
            for d in drivers:
                for bdf in self._commands.take(d / "bind"):
                    override = self._override(bdf)
                    ok = override in (None, d.name)
                    if self.tree.exists(bdf) and self.tree.driver_of(bdf) is None and ok:
                        self._changed(bdf, d.name)  # the driver's probe, then the link
                        self.tree.bind(bdf, d.name)
                        log.info("sysfs: %s bound to %s", bdf, d.name)
                        done += 1
            for bdf in self._commands.take(self.tree.root / "bus" / "pci" / "drivers_probe"):
                if not self.tree.exists(bdf) or self.tree.driver_of(bdf) is not None:
                    continue
                driver = self._override(bdf) or self.native_driver(bdf)
                if driver:
                    self._changed(bdf, driver)
                    self.tree.bind(bdf, driver)
                    log.info("sysfs: %s probed, bound to %s", bdf, driver)
                    done += 1
            return done + self._apply_numvfs()

    def watched_dirs(self) -> Iterator[Path]:
        """Where a write that :meth:`apply` acts on can land (and where new
        drivers and devices appear)."""
        yield self.tree.drivers
        yield self.tree.bus_devices
        yield self.tree.root / "bus" / "pci"
        yield from (p for p in self.tree.drivers.iterdir() if p.is_dir())
        yield from (link.parent.resolve() for link in self.tree.bus_devices.glob("*/sriov_numvfs"))

    def _changed(self, bdf: str, driver: str | None) -> None:
        if self.on_driver_change is not None:
            self.on_driver_change(bdf, driver)

    def _apply_numvfs(self) -> int:
        """Make every PF's VF count match its ``sriov_numvfs``."""
        done = 0
        for link in sorted(self.tree.bus_devices.glob("*/sriov_numvfs")):
            pf = link.parent.name
            try:
                wanted = int(link.read_text().strip() or 0)
            except ValueError:
                continue
            have = sorted(
                int(p.name[6:]) for p in link.parent.glob("virtfn*") if p.name[6:].isdigit()
            )
            for index in reversed(have[wanted:]):
                self.tree.remove_vf(pf, index)
                done += 1
            for index in range(len(have), wanted):
                bdf = self.tree.add_vf(pf, index)
                log.info("sysfs: PF %s created VF %d (%s)", pf, index, bdf)
                done += 1
        return done


class EffectsWatcher:
    """A daemon thread applying sysfs writes as they land (inotify), with a
    pass every ``safety_s`` seconds besides."""

    def __init__(self, effects: SysfsEffects, safety_s: float = 1.0) -> None:
        self._effects = effects
        self._safety_s = safety_s
        self._stop = threading.Event()
        self._watch = DirWatch(fallback_s=0.005)
        self._thread = threading.Thread(target=self._run, name="sysfs-effects", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for directory in self._effects.watched_dirs():
                    self._watch.add(directory)  # before the pass: no write falls between
                self._effects.apply()
            except OSError:
                log.exception("sysfs effects step failed")
            self._watch.wait(self._safety_s)

    def start(self) -> EffectsWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watch.wake()
        self._thread.join()
        self._watch.close()

    def __enter__(self) -> EffectsWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
