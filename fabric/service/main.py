"""Entry point of ``patchbay-fabric``: settings, inventory, state, HTTP server.

Concurrency model: one asyncio loop per process runs the aiohttp server and
one asyncio task per fabric task (attach/detach latency is an
``asyncio.sleep``). SQLite and simulated-host calls run on ONE worker thread
(``core.Fabric.call``), which is the store's only writer. SIGTERM/SIGINT stop
the server, cancel running tasks (left ``Running`` in the database: they are
rolled forward at the next start) and close the database.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from driver.process import run_process
from fabric.service import inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.settings import FabricSettings
from fabric.service.store import Store

log = logging.getLogger(__name__)


async def serve(settings: FabricSettings) -> None:
    inv = inventory.load(settings.fabric_topology)
    store = Store(settings.fabric_db)
    fab = Fabric(inv, store, (settings.attach_latency, settings.detach_latency))
    await fab.start()
    app = make_app(fab, settings.token_source())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tls = settings.server_ssl()
    site = web.TCPSite(runner, settings.listen_address, settings.fabric_port, ssl_context=tls)
    await site.start()
    port = int(runner.addresses[0][1]) if runner.addresses else settings.fabric_port
    if settings.port_file is not None:
        tmp = settings.port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(settings.port_file)
    log.info(
        "fabric serving %s on %s:%d: %d fabrics, %d devices, %d initiators, db %s",
        "HTTPS" if tls else "plain HTTP (--fabric-insecure)", settings.listen_address, port,
        len(inv.fabrics), len(inv.targets), len(inv.initiators), settings.fabric_db,
    )  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("fabric stopping")
        await runner.cleanup()
        await fab.close()


def main(argv: Sequence[str] | None = None) -> int:
    return run_process(FabricSettings, serve, "patchbay-fabric", argv)


if __name__ == "__main__":
    sys.exit(main())
