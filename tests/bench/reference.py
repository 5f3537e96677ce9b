"""The reference driver for the comparison: kubernetes-sigs/dra-example-driver.

Its ``cmd/dra-example-kubeletplugin`` is built from a checkout of its public
repository (the Go module proxy does not serve it; never vendored here) and
given to the bench as ``REFERENCE_PLUGIN=<binary>``. It runs with its ``gpu``
profile (driver ``gpu.example.com``, devices ``gpu-0``..``gpu-7`` in a pool
named after its node), its own CDI root, plugin and registry directories,
and the kubeconfig both plugins share. Both plugins authenticate as one
identity bound to one ClusterRole that holds what either needs (:data:`RULES`),
so neither has more rights than the other.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

DRIVER = "gpu.example.com"
GROUP = "bench:plugins"
SHIPPED_QPS = (5.0, 10)  # its --kube-api-qps / --kube-api-burst defaults

# The union of our plugin's rules (hack/rbac/plugin.yaml) and the reference
# driver's chart (deployments/helm/.../clusterrole.yaml).
RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
     "verbs": ["update"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
]  # fmt: skip


def apply_bench_rbac(api: client.ApiClient) -> None:
    """One ClusterRole for both plugins, bound to :data:`GROUP` (idempotent)."""
    rbac = client.RbacAuthorizationV1Api(api)
    role = {"metadata": {"name": "bench-plugins"}, "rules": RULES}
    binding = {
        "metadata": {"name": "bench-plugins"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "bench-plugins"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}],
    }  # fmt: skip
    for create in (
        lambda: rbac.create_cluster_role(role),
        lambda: rbac.create_cluster_role_binding(binding),
    ):
        try:
            create()
        except ApiException as exc:
            if exc.status != 409:
                raise


def describe(binary: Path) -> str:
    """What the binary is: its module line from ``go version -m`` and its
    VCS revision when it was built from a git checkout, and its sha256."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    try:
        info = subprocess.run(
            ["go", "version", "-m", str(binary)], capture_output=True, text=True, check=False
        ).stdout
    except FileNotFoundError:
        info = ""
    parts = [" ".join(line.split()[1:3]) for line in info.splitlines()
             if line.strip().startswith(("mod\t", "build\tvcs.revision="))]  # fmt: skip
    commit = os.environ.get("REFERENCE_COMMIT")  # the checkout's commit, when built from an archive
    if commit:
        parts.append(f"commit {commit}")
    return f"{binary} ({'; '.join(parts) or 'no build info'}; sha256 {digest})"


def start_reference(
    binary: Path,
    run_dir: Path,
    kubeconfig: Path,
    node: str,
    qps: float,
    burst: int,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one reference plugin for ``node``; the process and its registry dir."""
    registry = run_dir / "registry"
    for d in (registry, run_dir / "plugins", run_dir / "cdi"):
        d.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        f"--node-name={node}",
        f"--kubeconfig={kubeconfig}",
        f"--cdi-root={run_dir / 'cdi'}",
        f"--kubelet-registrar-directory-path={registry}",
        f"--kubelet-plugins-directory-path={run_dir / 'plugins'}",
        "--device-profile=gpu",
        f"--kube-api-qps={qps:g}",
        f"--kube-api-burst={burst}",
    ]
    with (run_dir / "plugin.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return proc, registry
