"""The ``kubectl patchbay`` views as the e2e tests read them: the plugin script
run against the test cluster, and its fabric view by device.

Why: the ``kubectl patchbay`` e2e modules (node-local, fabric, NVMe/CXL)
run the same script and read the same views."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.cluster import LocalCluster

SCRIPT = Path(sys.executable).parent / "kubectl-patchbay"


def kubectl_patchbay(cluster: LocalCluster, *args: str) -> str:
    cmd = [str(SCRIPT), "--kubeconfig", str(cluster.kubeconfig), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def fabric(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    view = json.loads(kubectl_patchbay(cluster, "fabric", "-o", "json"))
    return {d["device"]: d for d in view["devices"]}
