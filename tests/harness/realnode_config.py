"""Configuration files of one real node: containerd, CNI, kubelet, kube-proxy.

Why this module exists: every setting a real node needs on our machines, and
why, in one place (facts in ../shared/ARCHITECTURE.md section 11):

- containerd 2.4: CDI is always on, ``cdi_spec_dirs`` points at the plugin's
  CDI root; ``restrict_oom_score_adj`` because our VMs lack
  ``CAP_SYS_RESOURCE`` (without it every sandbox fails in runc with "can't
  get final child's PID from pipe"); the sandbox image is the locally built
  pause image, pinned so image GC never removes it.
- kubelet 1.37: ``failCgroupV1: false`` (hybrid cgroup v1 hosts),
  ``cgroupDriver: cgroupfs``, ``failSwapOn: false``, ``oomScoreAdj: 0``,
  ``makeIPTablesUtilChains: false`` (no host iptables), a ``cgroupRoot`` of
  its own, webhook authn/authz (so the apiserver's client cert is checked and
  ``kubectl logs/exec`` work), image GC off (nothing can be pulled again).
- kube-proxy: iptables mode inside the node's network namespace; conntrack
  sizing off (``maxPerCore: 0``, timeouts 0) and no localhost NodePorts, so
  it writes no host-wide setting.

All paths are the standard ones: the node's mount namespace makes them
private (tests/harness/realnode_net.py). Concurrency: pure functions.
"""

from __future__ import annotations

import json
from typing import Any

# Where a node's own directories appear inside its mount namespace.
KUBELET_ROOT = "/var/lib/kubelet"
CDI_DIR = "/var/run/cdi"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
CNI_CONF_DIR = "/var/lib/cni/net.d"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc


def containerd_toml(*, sandbox_image: str) -> str:
    """containerd 2.x config (version 3)."""
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCK}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["{CDI_DIR}"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{CNI_CONF_DIR}"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
"""


def cni_conflist(pod_cidr: str) -> str:
    """A bridge network for the node's pods, masqueraded towards the host."""
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "patchbay-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": "/var/lib/cni/networks",
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conf, indent=1) + "\n"


def kubelet_config(
    *, node_ip: str, cgroup_root: str, client_ca: str, gates: dict[str, bool]
) -> str:
    conf: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": client_ca},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "makeIPTablesUtilChains": False,
        "volumePluginDir": f"{KUBELET_ROOT}/volume-plugins",
        "resolvConf": "/etc/resolv.conf",
        # No cluster DNS here: pods use the node's resolver (see docs/real-nodes.md).
        "clusterDomain": "cluster.local",
        # Nothing can be pulled again: never garbage-collect images.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "10s",
        "featureGates": gates,
    }  # fmt: skip
    return json.dumps(conf, indent=1) + "\n"


def kube_proxy_config(
    *, kubeconfig: str, node_name: str, cluster_cidr: str, gates: dict[str, bool]
) -> str:
    conf: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": node_name,
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "detectLocalMode": "ClusterCIDR",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        "featureGates": gates,
    }
    return json.dumps(conf, indent=1) + "\n"
