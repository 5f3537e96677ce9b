"""The fabric e2e environment, shared by the fabric test modules (one per module),
and the chart tests' ``helm`` binary and server-side ``applier``.

Two GPU-less simulated nodes (``fabric-adapters``: a NIC PF with 4 VFs on
root pci0000:15, adapter0 on pci0000:15, adapter1 on pci0000:85), a real
``patchbay-fabric`` (by default switch sw0: gpu-0, gpu-1 wired to adapter0 of
both nodes; sw1: gpu-2 and the ConnectX NIC nic-0 wired to adapter1 of both;
a module overrides the ``fabric_layout`` fixture for other devices) and a
real ``patchbay-controller`` running with its own identity, bound to
hack/rbac/controller.yaml, polling the fabric only every 300 s (it follows
the fabric's event stream), serving /metrics on a free port.

The controller attaches in the ``connections`` dialect; a module that sets
``FABRIC_DIALECTS = DIALECTS`` runs once per dialect (its tests get an id
``[connections]`` / ``[zones]``, and a fresh env each). Only modules whose
subject is the attach itself do: the rest do not depend on the dialect.

A module may add flags to the node plugins (``plugin_args``) and to the
controller (``controller_args``). Every test that uses the env fails if one
of its hosts hot-removed a GPU still in use meanwhile (issue 34).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fabric.simhost import violations
from tests.e2e.chart import Applier, cached_tool
from tests.e2e.fabric_helpers import (
    ADAPTERS,
    GPU_LAYOUT,
    HOLD_S,
    LEASE_S,
    Env,
    FabricLayout,
    fabric_pool,
    fabric_slices,
)
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.harness.cluster_proc import free_port
from tests.harness.fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService
from tests.harness.simnode import PLUGIN_IDENTITY, SimNode, apply_rbac, build_nvml_mock

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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    dialects = getattr(metafunc.module, "FABRIC_DIALECTS", None)
    if dialects and "fabric_dialect" in metafunc.fixturenames:
        metafunc.parametrize("fabric_dialect", dialects, indirect=True, scope="module")


@pytest.fixture(scope="module")
def fabric_dialect(request: pytest.FixtureRequest) -> str:
    """The controller's --fabric-dialect for this module's env."""
    return str(getattr(request, "param", "connections"))


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    """The devices of this module's fabric (override in a module for others)."""
    return GPU_LAYOUT


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    """More flags for this module's controller (override in a module)."""
    return ()


@pytest.fixture(scope="module")
def node_topology() -> str:
    """The simulated hosts' board (fabric/simhost/topologies.py; override in a
    module): its adapters must sit where ``ADAPTERS`` says."""
    return "fabric-adapters"


@pytest.fixture(scope="module")
def plugin_args() -> tuple[str, ...]:
    """More flags for this module's node plugins (override in a module)."""
    return ()


@pytest.fixture(autouse=True)
def no_gpu_removed_in_use(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test during which a fabric env's host hot-removed a GPU still in
    use (a MIG instance or a process on it): a real host does not refuse that
    remove, so the simulated one records it (fabric/simhost/violations.py)."""
    if "env" not in request.fixturenames:
        yield
        return
    hosts = [n.host.dir for n in request.getfixturevalue("env").nodes]
    before = {h: len(violations.read(h)) for h in hosts}
    yield
    found = [v for h in hosts for v in violations.read(h)[before[h] :]]
    assert found == [], f"GPUs hot-removed while in use: {found}"


def label(core: client.CoreV1Api, node: str, labels: dict[str, str]) -> bool:
    """Label ``node`` once its agent registered it (False until then)."""
    try:
        core.patch_node(node, {"metadata": {"labels": labels}})
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


@pytest.fixture(scope="module")
def env(  # type: ignore[no-untyped-def]
    local_cluster, resource_api, core, tmp_path_factory, fabric_dialect: str,
    fabric_layout: FabricLayout, controller_args: tuple[str, ...], plugin_args: tuple[str, ...],
    node_topology: str,
) -> Iterator[Env]:  # fmt: skip
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
    plugin_kc = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    names = [unique("fab"), unique("fab")]
    args = (ADAPTERS, f"--vf-config={vf_config}", *plugin_args)
    nodes = [SimNode(local_cluster, n, node_topology, plugin_kc, args) for n in names]
    run = Path(local_cluster.run_dir)
    fabric = FabricService(run / "fabric", fabric_layout.spec(nodes))
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
        f"--fabric-dialect={fabric_dialect}",
        *controller_args,
    )
    e = Env(nodes, fabric, ctl, fabric_dialect, fabric_layout)
    e.per_domain = "--fabric-pool-shape=per-node" not in controller_args  # the default
    try:
        for n in nodes:
            n.start()
        # Labelled as provisioning would, whatever the shape (docs/fabric.md,
        # "Reach labels"): an upgrade to per-domain finds them there.
        for name, labels in fabric_layout.reach_labels(nodes).items():
            wait_for(f"{name} labelled", functools.partial(label, core, name, labels))
        fabric.start()
        ctl.start()
        mine = set(names)

        def published() -> bool:  # by this module's controller, for these nodes
            pool = fabric_pool(resource_api).values()
            if e.per_domain:  # each device once, bound to no node
                return len(pool) == fabric_layout.devices() and all(d.node_name is None
                                                                   for d in pool)  # fmt: skip
            return len(pool) == e.pool_size and all(d.node_name in mine for d in pool)

        wait_for(
            f"{e.pool_size} fabric variants published for {names} ({fabric_dialect})",
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
