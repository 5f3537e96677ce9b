"""What importing the node plugin's entry modules must not load (issue 36, RSS).

The plugin's resident memory after start is mostly what it imports; some
packages are imported only when the setting that needs them is on. This
test runs ``import plugin.app, plugin.main`` in a fresh interpreter (the
same imports as the bench's import floor, ``tests.bench.floors``) and checks
that none of them was loaded, so a module-level import cannot silently put
the cost back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# package (a module name, or a prefix of its modules' names up to "." or "_")
# -> why the entry modules must not import it
LAZY = {
    "grpclib": "the plugin served with it until issue 36; only the bench's floor uses it",
    "h2": "grpclib's HTTP/2 stack: the plugin's server speaks HTTP/2 itself (plugin.servers)",
    "hpack": "the plugin decodes HPACK itself (plugin.servers.h2headers); tests check it",
    "aiohttp": "driver.kube.proxied's, behind a proxy-url (/metrics: driver.http1server)",
    "yaml": "only for a kubeconfig or VF config file that is not JSON (1.6 MB resident)",
    "kubernetes": "driver.kube.api has its own client (tests/unit/test_kube_api.py checks a run)",
    "grpc": "grpcio: the plugin serves with its own HTTP/2 server (plugin.servers)",
    "driver.controller": "the controller's code",
    "driver.fabricclient": "the fabric manager client: the controller's",
    "driver.inspect": "kubectl-patchbay's code",
}


def early(modules: list[str], package: str) -> list[str]:
    return [m for m in modules if m == package or m.startswith((package + ".", package + "_"))]


def loaded_after(imports: str) -> list[str]:
    code = f"{imports}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_plugin_entry_imports_no_lazy_package() -> None:
    modules = loaded_after("import plugin.app, plugin.main")
    assert "plugin.app" in modules  # the probe ran
    found = {p: early(modules, p) for p in LAZY}
    assert not {p: ms for p, ms in found.items() if ms}, f"imported too early: {found}; see {LAZY}"


SERVE = (
    "import asyncio, contextlib\n"
    "from prometheus_client import CollectorRegistry\n"
    "from driver import httpendpoint\n"
    "async def main():\n"
    "    task = asyncio.create_task({call})\n"
    "    await asyncio.sleep(0.01)\n"
    "    task.cancel()\n"
    "    with contextlib.suppress(asyncio.CancelledError):\n"
    "        await task\n"
    "asyncio.run(main())"
)


def test_serving_the_endpoint_imports_no_aiohttp_server() -> None:
    """Serving /metrics and /healthz loads no aiohttp server, while serving
    an aiohttp application (the controller's webhook) does: the probe can see
    such a lazily imported package."""
    endpoint = "httpendpoint.serve_http(0, CollectorRegistry(), lambda: True, '127.0.0.1')"
    modules = loaded_after(SERVE.format(call=endpoint))
    assert "driver.http1server" in modules and not early(modules, "aiohttp")
    app = "__import__('aiohttp.web').web.Application()"
    app = f"httpendpoint.serve_app({app}, '127.0.0.1', 0, None, 'x')"
    assert early(loaded_after(SERVE.format(call=app)), "aiohttp.web")
