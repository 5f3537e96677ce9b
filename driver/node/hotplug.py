"""React to PCI hot-plug: re-enumerate and republish within a second.

Sources: the kernel's uevents through pyudev (``udev``) or a simulated
host's feed (``feed:<path>``), which carries the same events. Either is read
by a daemon thread that hands events to the asyncio loop; the loop collects
a short burst (a GPU arriving brings its functions and bridges at once) and
then calls the rescan callback once. Only ``add``/``remove``/``change``
actions trigger a rescan; driver bind/unbind events do not. Each PCI
``add``/``remove`` is noted in :class:`driver.pci.arrivals.Arrivals` before
the rescan, so the scan knows which functions have finished arriving.

The watch is a vital task and never ends quietly. When the event source
fails, or simply ends (a source has no natural end: the kernel's event
stream does not stop), the reader thread always hands the loop an
end-of-stream marker, also in the middle of a burst, and :func:`watch`
raises :class:`driver.errors.HotplugError`. We do not restart the source
in-process: the plugin's supervising task group fails, the process exits
non-zero and the DaemonSet restarts it, and the new process's first scan
sees whatever changed meanwhile, so no event is lost. From the moment the
watch ends the plugin's ``/healthz`` answers 503 (``plugin.app``), so a
plugin whose shutdown stalls is not reported healthy either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from driver.errors import ConfigError, HotplugError
from driver.logconfig import log_context
from driver.metrics import HOTPLUG_EVENTS
from driver.pci.arrivals import Arrivals
from driver.pci.uevents import UeventFeed

log = logging.getLogger(__name__)

DEBOUNCE_S = 0.05
ACTIONS = frozenset({"add", "remove", "change"})


def open_source(spec: str, sysfs_root: Path) -> Iterator[Any] | None:
    """The blocking event iterator named by ``spec``, or None for ``none``."""
    if spec == "none":
        return None
    if spec == "udev":
        from driver.node.udev import pci_events

        return pci_events()
    if spec.startswith("feed:"):
        path = Path(spec.removeprefix("feed:"))
        # Start at the feed's end: the initial scan already saw what is there.
        offset = path.stat().st_size if path.exists() else 0
        return iter(UeventFeed(path, str(sysfs_root), offset=offset))
    raise ConfigError(f"--hotplug-source: unknown source {spec!r} (udev, feed:<path>, none)")


_END = object()  # the reader thread's end-of-stream marker


async def watch(
    source: Iterator[Any],
    rescan: Callable[[], Awaitable[None]],
    debounce_s: float = DEBOUNCE_S,
    arrivals: Arrivals | None = None,
) -> None:
    """Call ``rescan`` after each burst of hot-plug events, having told
    ``arrivals`` which PCI functions were added or removed.

    Runs until cancelled, or raises :class:`HotplugError` once ``source``
    ends or fails (the events of that last burst are left to the next
    process's full scan).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    failure: list[BaseException] = []

    def pump() -> None:
        try:
            for event in source:
                loop.call_soon_threadsafe(queue.put_nowait, event)
        except BaseException as exc:  # reported on the loop
            failure.append(exc)
        finally:
            # (RuntimeError: the loop is already closed, nobody is waiting.)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, _END)

    threading.Thread(target=pump, name="hotplug-events", daemon=True).start()
    while True:
        burst = [await queue.get()]
        if burst[0] is not _END:
            await asyncio.sleep(debounce_s)
            while not queue.empty():
                burst.append(queue.get_nowait())
        if _END in burst:
            if failure:
                raise HotplugError(f"hot-plug event source failed: {failure[0]!r}") from failure[0]
            raise HotplugError("hot-plug event source ended")
        relevant = [e for e in burst if getattr(e, "action", "") in ACTIONS]
        if not relevant:
            continue
        for e in relevant:
            HOTPLUG_EVENTS.labels(action=e.action).inc()
            if arrivals is not None and getattr(e, "subsystem", "") == "pci":
                arrivals.note(e.action, e.get("PCI_SLOT_NAME") or e.device_path.rsplit("/", 1)[-1])
        devices = ",".join(dict.fromkeys(e.device_path.rsplit("/", 1)[-1] for e in relevant))
        with log_context(device=devices):  # the rescan's lines say which devices came or went
            log.info(
                "hot-plug: %s; re-enumerating",
                ", ".join(f"{e.action} {e.device_path.rsplit('/', 1)[-1]}" for e in relevant),
            )
            await rescan()
