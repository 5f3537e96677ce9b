"""The control plane's command lines: etcd, kube-apiserver, the scheduler and
the controller-manager, with every flag and why it is set.

Why this module exists: the flags are the facts a reader of the harness looks
for (which gates, which admission, why the apiserver closes on SIGTERM), and
they changed more often than the launcher's lifecycle; kept apart from
:class:`tests.harness.cluster.LocalCluster`, which decides only when each
component starts and stops.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.harness.cluster_pki import Pki

# Only gates the pinned release still lets us set (not GA-locked): see
# pkg/features/kube_features.go at the pinned k8s.io/kubernetes version.
# DRAResourceClaimDeviceStatus, DRAPrioritizedList, DRAAdminAccess and
# DRAExtendedResource are GA and locked on in 1.37; DRADeviceTaints is GA and on
# by default (setting it only logs a warning), so all of those are on anyway.
FEATURE_GATES = (
    "DRAPartitionableDevices",
    "DRADeviceBindingConditions",
    "DRAConsumableCapacity",
    "ResourceHealthStatus",
)
RUNTIME_CONFIG = (
    "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true"
)
SERVICE_CIDR = "10.0.0.0/24"
# The node lifecycle controller removes the not-ready taint that admission puts on
# every new Node once it reports Ready; tests also create Node objects by hand that
# nothing heartbeats for, so the grace period before "unknown" is an hour, not 50s.
NODE_MONITOR_GRACE = "1h"


@dataclass(frozen=True)
class ControlPlaneArgv:
    """The command lines of one control plane: where it keeps its files
    (``run_dir``), its certificates (``pki``), the binaries' directory, the
    apiserver's address, the gates (``Gate=true,...``) and runtime config."""

    run_dir: Path
    pki: Pki
    bins: Path
    address: str
    gates: str
    runtime_config: str
    audit_log: Path | None
    profiling: bool = False  # the scheduler serves /debug/pprof (the scale bench's profile)

    def etcd(self, port: int, peer: int) -> list[str]:
        client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        return [
            str(self.bins / "etcd"), "--name=local", f"--data-dir={self.run_dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=local={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=4294967296",
        ]  # fmt: skip

    def apiserver(self, etcd_port: int, port: int) -> list[str]:
        serving = self.pki.issue(
            "apiserver", "kube-apiserver",
            server_sans=tuple(dict.fromkeys((
                "IP:127.0.0.1", f"IP:{self.address}", "IP:10.0.0.1", "DNS:localhost",
                "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc"))),
        )  # fmt: skip
        # What the apiserver presents to kubelets (webhook authn on real nodes);
        # system:masters so that the kubelet's authorizer allows logs and exec.
        kubelet_client = self.pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        sa = self.pki.service_account_keys()
        proxy = self.pki.issue("front-proxy-client", "front-proxy-client")
        return [
            str(self.bins / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--secure-port={port}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca.cert}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
            f"--service-account-key-file={sa.cert}", f"--service-account-signing-key-file={sa.key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}", f"--feature-gates={self.gates}",
            f"--runtime-config={self.runtime_config}",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            # The aggregation-layer CA: without it every client logs a missing CA bundle.
            f"--requestheader-client-ca-file={self.pki.ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy.cert}", f"--proxy-client-key-file={proxy.key}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            # Node names do not resolve here: dial kubelets by their InternalIP.
            "--kubelet-preferred-address-types=InternalIP",
            # Loopback cannot be an endpoint of the kubernetes Service; real nodes'
            # pods reach a non-loopback address through it (kube-proxy).
            f"--endpoint-reconciler-type={'none' if self.address == '127.0.0.1' else 'lease'}",
            # SIGTERM: drain the in-flight requests, then close the HTTP server within 2 s.
            # By default its Shutdown waits up to the 60 s request timeout for every open
            # connection, and a client's open watch (a test's, a user's kubectl -w in the
            # demo) kept it past our 15 s SIGTERM grace ("ignored SIGTERM", issue 33).
            "--shutdown-send-retry-after=true",
            "--profiling=false", "--v=1", *self._audit(),
        ]  # fmt: skip

    def _audit(self) -> list[str]:
        if self.audit_log is None:
            return []
        policy = self.run_dir / "audit-policy.json"
        policy.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}],
        }))  # fmt: skip
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}"]

    def _common(self, kubeconfig: Path, port: int, name: str) -> list[str]:
        return [
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", f"--cert-dir={self.run_dir / (name + '-certs')}",
            "--leader-elect=false", f"--feature-gates={self.gates}",
            f"--profiling={str(self.profiling and name == 'scheduler').lower()}", "--v=1",
        ]  # fmt: skip

    def controller_manager(self, kubeconfig: Path, port: int) -> list[str]:
        sa = self.pki.service_account_keys()
        return [
            str(self.bins / "kube-controller-manager"), *self._common(kubeconfig, port, "kcm"),
            "--controllers=*", f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={sa.key}", f"--root-ca-file={self.pki.ca.cert}",
            f"--cluster-signing-cert-file={self.pki.ca.cert}",
            f"--cluster-signing-key-file={self.pki.ca.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allocate-node-cidrs=false",
        ]  # fmt: skip

    def scheduler(self, kubeconfig: Path, port: int) -> list[str]:
        return [str(self.bins / "kube-scheduler"), *self._common(kubeconfig, port, "scheduler")]
