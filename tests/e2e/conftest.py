"""The fabric e2e environment, shared by the fabric test modules (one per module),
and the chart tests' ``helm`` binary and server-side ``applier``.

Two GPU-less simulated nodes (``fabric-adapters``: a NIC PF with 4 VFs on
root pci0000:15, adapter0 on pci0000:15, adapter1 on pci0000:85), a real
``patchbay-fabric`` (switch sw0: gpu-0, gpu-1 wired to adapter0 of both
nodes; sw1: gpu-2 and the ConnectX NIC nic-0 wired to adapter1 of both) and
a real ``patchbay-controller`` running with its own identity, bound to
hack/rbac/controller.yaml, polling the fabric only every 300 s (it follows
the fabric's event stream), serving /metrics on a free port.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cluster_proc import free_port
from fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from simnode import SimNode, apply_rbac, build_nvml_mock

from tests.e2e.chart import Applier, cached_tool
from tests.e2e.fabric_helpers import (
    ADAPTERS,
    HOLD_S,
    LEASE_S,
    POOL_SIZE,
    Env,
    fabric_pool,
    fabric_slices,
)
from tests.e2e.helpers import delete_quietly, unique, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def helm() -> Path:
    """The cached helm binary, built by `make helm-bin` if missing."""
    return cached_tool("helm-bin", "helm-path")


@pytest.fixture
def applier(api_client: client.ApiClient) -> Iterator[Applier]:
    a = Applier(api_client)
    yield a
    a.cleanup()


@pytest.fixture(scope="module")
def env(local_cluster, resource_api, core, tmp_path_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    build_nvml_mock()
    apply_rbac(local_cluster.kubeconfig, "plugin.yaml")
    apply_rbac(local_cluster.kubeconfig, "controller.yaml")
    for path in sorted((REPO / "deviceclasses").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "DeviceClass":
                with contextlib.suppress(ApiException):
                    resource_api.create_device_class(doc)
    vf_config = tmp_path_factory.mktemp("vf") / "vf.yaml"
    vf_config.write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
    plugin_kc = local_cluster.kubeconfig_for(
        "patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",)
    )
    names = [unique("fab"), unique("fab")]
    nodes = [
        SimNode(
            local_cluster, n, "fabric-adapters", plugin_kc, (ADAPTERS, f"--vf-config={vf_config}")
        )
        for n in names
    ]
    spec = {
        "switches": [
            switch("sw0", [(n.name, "adapter0", n.host.dir) for n in nodes], ["gpu-0", "gpu-1"]),
            switch("sw1", [(n.name, "adapter1", n.host.dir) for n in nodes], ["gpu-2"], ["nic-0"]),
        ]
    }
    run = Path(local_cluster.run_dir)
    fabric = FabricService(run / "fabric", spec)
    ctl_kc = local_cluster.kubeconfig_for(
        "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
    )
    ctl = ControllerProcess(
        ctl_kc,
        fabric,
        run / "logs" / "controller.log",
        f"--failed-device-hold={HOLD_S}",
        f"--lease-duration={LEASE_S}",
        f"--metrics-port={free_port()}",
    )
    e = Env(nodes, fabric, ctl)
    try:
        for n in nodes:
            n.start()
        fabric.start()
        ctl.start()
        mine = set(names)

        def published() -> bool:  # by this module's controller, for these nodes
            pool = fabric_pool(resource_api).values()
            return len(pool) == POOL_SIZE and all(d.node_name in mine for d in pool)

        wait_for(
            f"{POOL_SIZE} fabric variants published for {names}",
            lambda: e.check_alive() and published(),
            timeout=90,
        )
        yield e
    finally:
        # A test may have replaced env.ctl (a standby that took over): stop
        # both, or the leftover keeps the Lease from the next module's.
        e.ctl.stop()
        ctl.stop()
        fabric.stop()
        for s in fabric_slices(resource_api):  # the next module starts from none
            delete_quietly(resource_api.delete_resource_slice, s.metadata.name)
        for n in nodes:
            n.stop()
            delete_quietly(core.delete_node, n.name)
