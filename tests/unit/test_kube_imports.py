"""The node plugin imports the Kubernetes client's aio part only: the
package's ``__init__`` files would load the whole synchronous client (about
8 MB resident, counted against the plugin's 80 MB)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_connecting_loads_no_synchronous_client(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        import plugin.app
        from driver.kube.api import KubeApi

        async def main():
            api = await KubeApi.connect({str(kubeconfig)!r})
            await api.close()

        asyncio.run(main())
        print(" ".join(sorted(m for m in sys.modules if m.startswith("kubernetes"))))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "kubernetes.aio.config" in out and "kubernetes.aio.client.api_client" in out
    assert not [m for m in out if not m.startswith("kubernetes.aio") and m != "kubernetes"]
    assert "kubernetes.aio.stream" not in out and "kubernetes.aio.dynamic" not in out
