"""Entry point of ``patchbay-controller``: settings, leader election, run.

Concurrency model: one asyncio loop. The replica first waits for the leader
Lease; once it holds it, the reconciler (watches, publisher, fabric refresh,
attach/detach tasks), the device lease keeper (``--device-leases``,
``driver.controller.leases.keeper``) and the leader Lease's renewal run in
one TaskGroup. The HTTP
endpoint (``--metrics-port``: ``/metrics``, ``/healthz``) serves from the
start, also while the replica waits as a follower, and so does the
admission webhook (``--webhook-port``, ``driver.controller.process.webhook``): every
replica answers admission, so a leader change never interrupts it. Losing the
lease ends the process with exit code 5 (``driver.errors.LeaseLost``) so
its supervisor restarts it as a follower: state is rebuilt from the API and
the fabric, never carried over. SIGTERM/SIGINT stop everything: first the
reconciler and the attach/detach tasks it started, then a leader gives the
Lease up at once (``LeaderLease.release``), so a follower takes it on its
next try instead of waiting for it to expire.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from driver.controller.process.settings import ControllerSettings
from driver.controller.process.webhook import serve_webhook
from driver.errors import LeaseLost, Stopped
from driver.httpendpoint import serve_http
from driver.metrics import CONTROLLER, CONTROLLER_LEADER
from driver.process import run_process

log = logging.getLogger(__name__)


async def _run(settings: ControllerSettings) -> None:
    from driver.controller.leases.keeper import LeaseKeeper
    from driver.controller.process.leader import LeaderLease
    from driver.controller.reconciler import Reconciler
    from driver.fabricclient.client import FabricClient
    from driver.kube.api import KubeApi

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api = await KubeApi.connect(settings.kubeconfig)
    lease = LeaderLease(
        api, settings.lease_namespace, settings.lease_name, settings.identity,
        settings.lease_timing(),
    )  # fmt: skip

    async def until_stopped() -> None:
        await stop.wait()
        raise Stopped  # SIGTERM/SIGINT

    async def keep_lease() -> None:
        await lease.keep()
        raise LeaseLost("leader lease lost")

    try:
        fabric_client = FabricClient(
            settings.fabric_url, settings.fabric_credentials(settings.client_ssl()),
            tls=settings.client_ssl(), server_name=settings.fabric_server_name,
            dialect=settings.dialect(),
            systems=settings.system_nodes(),
            limits=settings,
        )  # fmt: skip
        async with fabric_client as fabric:
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(until_stopped())
                    if settings.metrics_port:  # followers are scraped and probed too
                        http = serve_http(settings.metrics_port, CONTROLLER, lambda: True)
                        group.create_task(http, name="http")
                    if settings.webhook_port:  # every replica admits, not only the leader
                        group.create_task(serve_webhook(settings), name="webhook")
                    await lease.acquire()
                    CONTROLLER_LEADER.set(1)
                    group.create_task(keep_lease(), name="lease")
                    reconciler = Reconciler(api, fabric, settings)
                    group.create_task(reconciler.run(), name="reconciler")
                    if settings.device_leases:
                        keeper = LeaseKeeper(api, reconciler.events)
                        group.create_task(keeper.run(), name="device-leases")
            except* Stopped:
                log.info("controller stopped")
            finally:  # the reconciler has ended, its attaches with it: give the Lease up
                await lease.release()
                CONTROLLER_LEADER.set(0)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    return run_process(ControllerSettings, _run, "patchbay-controller", argv)


if __name__ == "__main__":
    sys.exit(main())
