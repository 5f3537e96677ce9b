"""Entry point of ``patchbay-plugin``: parse settings, configure logging, run."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from driver.errors import PatchbayError
from driver.logconfig import configure
from driver.settingsflags import parse_settings
from plugin.settings import PluginSettings

log = logging.getLogger(__name__)


async def _run(settings: PluginSettings) -> None:
    from driver.kube.api import KubeApi
    from plugin.app import NodePlugin
    from plugin.device_types import device_types

    api = await KubeApi.connect(settings.kubeconfig)
    try:
        await NodePlugin(settings, api, device_types(settings)).run()
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(PluginSettings, argv, prog="patchbay-plugin")
    except PatchbayError as exc:
        print(f"patchbay-plugin: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    try:
        asyncio.run(_run(settings))
    except PatchbayError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
