"""Entry point of ``patchbay-plugin``: parse settings, configure logging, run."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from driver.process import run_process
from plugin.settings import PluginSettings

log = logging.getLogger(__name__)


async def _run(settings: PluginSettings) -> None:
    from driver.kube.api import KubeApi
    from plugin.app import NodePlugin, checkpoint_store
    from plugin.device_types import device_types

    api = await KubeApi.connect(settings.kubeconfig)
    try:
        store = checkpoint_store(settings)  # one per process
        await NodePlugin(settings, api, device_types(settings, store), store).run()
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    return run_process(PluginSettings, _run, "patchbay-plugin", argv)


if __name__ == "__main__":
    sys.exit(main())
