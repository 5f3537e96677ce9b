"""The real plugin process on hostile hosts (issue 17, docs/design.md "Hostile hosts").

A simulated host with GPUs and a NIC whose VFs are offered, and a plugin
that finds no usable NVML: no ``libnvidia-ml.so.1`` below its driver root,
or NVML init failing with ``DRIVER_NOT_LOADED`` (the mock's state-file
switch). The plugin must start, publish the VFs without GPUs, say why on
``/healthz``, and offer the GPUs once NVML works, in the same process,
re-registering with the kubelet (this test plays it) to add the health
stream; with ``--nvml-required`` it exits with the discovery exit code.
A CDI directory that is not writable fails the claim naming the path and
leaks nothing; the claim succeeds once the directory is fixed. A read-only,
partly missing sysfs publishes what can be read and logs the rest; kubelet
directories that do not exist yet are created. The read-only cases need bind
mounts (root, as this repository's test machines run).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from fabric.simhost.topologies import TOPOLOGIES
from tests.checkpoint_view import recorded
from tests.cluster_fixtures import missing_prerequisite
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.cluster_proc import free_port
from tests.harness.simnode import NVML_MOCK_LIB, PluginProcess
from tests.integration.kubelet import Kubelet, our_slices, wait_registered
from tests.integration.own_node import OwnNode, own_node
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

HEALTH = "v1alpha1.DRAResourceHealth"
DISCOVERY_EXIT = 3  # driver.errors.DiscoveryError.exit_code


class Hostile:
    """One plugin on its own simulated host, started as a test asks."""

    def __init__(self, node: OwnNode) -> None:
        self.base = node.base
        self.driver_root = self.base / "driver"
        self.driver_root.mkdir()
        vf_config = self.base / "vf.yaml"
        vf_config.write_text("pfs:\n  - vendorID: '15b3'\n")
        self.port = free_port()
        self.proc = node.plugin(
            f"--vf-config={vf_config}",
            f"--driver-root={self.driver_root}",
            f"--metrics-port={self.port}",
        )

    def start(self, *args: str, library: bool = False) -> PluginProcess:
        """Start the plugin; without ``library`` no NVML library is reachable."""
        self.proc.extra_args = (*self.proc.extra_args, *args)
        if library:
            return self.proc.start()
        return self.proc.start(PATCHBAY_NVML_LIBRARY="")

    def install_library(self) -> None:
        """A driver install: the library appears below the driver root (atomically)."""
        lib_dir = self.driver_root / "usr" / "lib64"
        lib_dir.mkdir(parents=True)
        shutil.copy(NVML_MOCK_LIB, lib_dir / ".tmp")
        (lib_dir / ".tmp").rename(lib_dir / "libnvidia-ml.so.1")

    def healthz(self) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()


@pytest.fixture
def hostile(local_cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[Hostile]:
    with own_node(local_cluster, core, "hostile", TOPOLOGIES["2x-h100-nic"]()) as node:
        yield Hostile(node)


def any_vf(names: set[str]) -> bool:
    return any(n.startswith("vf") for n in names)


def published(resource_api: client.ResourceV1Api, node: str) -> set[str]:
    return {d.name for s in our_slices(resource_api, node) for d in s.spec.devices or []}


def assert_vfs_without_gpus(h: Hostile, resource_api: client.ResourceV1Api, why: str) -> Kubelet:
    node = h.proc.node_name
    kubelet = wait_registered(h.proc)
    wait_for("VFs published", lambda: any_vf(published(resource_api, node)), timeout=30)
    names = published(resource_api, node)
    assert not any(n.startswith("gpu") for n in names), names
    status, body = h.healthz()
    assert status == 200, body  # only GPUs are missing: the plugin is healthy
    assert "gpus: not offered" in body and why in body, body
    assert "GPUs not offered" in h.proc.log_tail(400) and why in h.proc.log_tail(400)
    assert HEALTH not in kubelet.get_info().supported_versions
    return kubelet


def assert_gpus_picked_up(
    h: Hostile, kubelet: Kubelet, resource_api: client.ResourceV1Api, pid: int
) -> None:
    node = h.proc.node_name
    socket_before = kubelet.reg_socket().stat().st_ctime_ns
    gpus = {f"gpu-{i}" for i in range(4)}
    wait_for("GPUs published", lambda: gpus <= published(resource_api, node), timeout=90)
    assert any_vf(published(resource_api, node))
    assert h.proc.proc is not None and h.proc.proc.pid == pid and h.proc.alive  # no restart
    versions = kubelet.get_info().supported_versions
    assert HEALTH in versions, versions
    # The registration socket was made anew (the kubelet's cue to register again).
    assert "re-registering with the kubelet" in h.proc.log_tail(400)
    assert kubelet.reg_socket().stat().st_ctime_ns != socket_before
    status, body = h.healthz()
    assert status == 200 and "not offered" not in body, body


@pytest.mark.parametrize("mig", [(), ("--mig-gpus=all",)], ids=["gpus", "mig"])
def test_no_library_serves_vfs_then_picks_gpus_up(
    hostile: Hostile, resource_api: client.ResourceV1Api, mig: tuple[str, ...]
) -> None:
    proc = hostile.start(*mig)
    assert proc.proc is not None
    pid = proc.proc.pid
    kubelet = assert_vfs_without_gpus(hostile, resource_api, "libnvidia-ml.so.1 not found below")
    assert str(hostile.driver_root) in hostile.healthz()[1]
    hostile.install_library()
    assert_gpus_picked_up(hostile, kubelet, resource_api, pid)
    if mig:  # the MIG start-up check ran once NVML worked: partitions are offered
        assert any("-mig-" in n for n in published(resource_api, proc.node_name))


def test_driver_not_loaded_then_loaded(
    hostile: Hostile, resource_api: client.ResourceV1Api
) -> None:
    hostile.proc.host.nvml.set_driver_loaded(False)
    proc = hostile.start(library=True)
    assert proc.proc is not None
    pid = proc.proc.pid
    kubelet = assert_vfs_without_gpus(hostile, resource_api, "DRIVER_NOT_LOADED")
    hostile.proc.host.nvml.set_driver_loaded(True)
    assert_gpus_picked_up(hostile, kubelet, resource_api, pid)


@pytest.mark.parametrize("cause", ["no-library", "driver-not-loaded"])
def test_nvml_required_exits_with_discovery_code(hostile: Hostile, cause: str) -> None:
    if cause == "no-library":
        proc, line = hostile.start("--nvml-required=true"), "LIBRARY_NOT_FOUND"
    else:
        hostile.proc.host.nvml.set_driver_loaded(False)
        proc, line = hostile.start("--nvml-required=true", library=True), "DRIVER_NOT_LOADED"
    assert proc.wait_exit(60) == DISCOVERY_EXIT
    last = [ln for ln in proc.log_tail(400).splitlines() if "exiting with status" in ln]
    assert last and f"exiting with status {DISCOVERY_EXIT}" in last[-1] and line in last[-1], last


def read_only(path: Path) -> None:
    """Make ``path`` read-only as a mount (root ignores file modes)."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)


def can_mount() -> bool:
    probe = Path(tempfile.mkdtemp(prefix="pb-ro-", dir="/tmp"))
    try:
        read_only(probe)
    except (OSError, subprocess.CalledProcessError):
        return False
    finally:
        subprocess.run(["umount", str(probe)], check=False, capture_output=True)
        probe.rmdir()
    return True


@pytest.fixture
def bind_mounts() -> None:
    """Bind mounts (root) make a read-only directory; without them the test
    is skipped, and fails under CI=true like every missing prerequisite."""
    if not can_mount():
        missing_prerequisite("needs bind mounts (root) for a read-only directory")


@pytest.mark.usefixtures("bind_mounts")
def test_cdi_dir_not_writable_fails_the_claim_naming_the_path(
    hostile: Hostile, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    proc = hostile.start(library=True)
    node, cdi = proc.node_name, proc.cdi_root
    kubelet = wait_registered(proc)
    endpoint = kubelet.get_info().endpoint
    wait_for("GPUs published", lambda: "gpu-1" in published(resource_api, node), timeout=30)
    kept = allocated_claim(resource_api, namespace, "kept", node, ["gpu-0"])
    assert kubelet.prepare(endpoint, [(namespace, "kept", kept)])[kept].error == ""
    uid = allocated_claim(resource_api, namespace, "c", node, ["gpu-1"])
    read_only(cdi)
    try:
        failed = kubelet.prepare(endpoint, [(namespace, "c", uid), (namespace, "kept", kept)])
        assert str(cdi) in failed[uid].error and "not writable" in failed[uid].error, failed
        assert failed[kept].error == "" and failed[kept].devices  # the other claim is unaffected
        records = recorded(proc.plugin_dir / "checkpoint.json")["claims"]
        assert uid not in records and kept in records  # nothing of the failed claim kept
    finally:
        subprocess.run(["umount", str(cdi)], check=True)
    assert kubelet.prepare(endpoint, [(namespace, "c", uid)])[uid].error == ""
    both = [(namespace, "c", uid), (namespace, "kept", kept)]
    assert all(r.error == "" for r in kubelet.unprepare(endpoint, both).values())
    assert proc.proc is not None
    spare = f".k8s.patchbay.dev-claim.spare.tmp-{proc.proc.pid}-"  # then the process's random tag
    left = [p.name for p in cdi.iterdir()]
    assert len(left) <= 1 and all(n.startswith(spare) for n in left), left  # no spec, no temp file
    assert recorded(proc.plugin_dir / "checkpoint.json")["claims"] == {}


@pytest.mark.usefixtures("bind_mounts")
def test_read_only_partial_sysfs_publishes_what_it_can_read(
    hostile: Hostile, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    sysfs = hostile.proc.host.sysfs_root
    devices = sysfs / "bus" / "pci" / "devices"
    gone_gpu = devices / "0000:19:00.0"  # NVML still reports it; its sysfs node is gone
    shutil.rmtree(gone_gpu.resolve())
    (devices / "0000:8a:00.0" / "sriov_totalvfs").resolve().unlink()  # a half-removed PF
    (hostile.base / "vf.yaml").write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
    read_only(sysfs)  # numVfs 8 -> 4 cannot be written
    try:
        proc = hostile.start(library=True)
        node = proc.node_name
        kubelet = wait_registered(proc)
        gpus = {f"gpu-{i}" for i in range(4)}
        wait_for("GPUs published", lambda: gpus <= published(resource_api, node), timeout=30)
        names = published(resource_api, node)
        vfs = {n for n in names if n.startswith("vf")}
        assert len(vfs) == 8, names  # the readable PF's VFs as they are; none of the other
        log = proc.log_tail(600)
        assert "sriov_numvfs" in log and "Read-only file system" in log
        assert "0000:8a:00.0" in log and "0000:19:00.0" in log
        assert proc.alive
        # netdev mode writes nothing on the host; vfio-pci rebinds (a sysfs write).
        endpoint = kubelet.get_info().endpoint
        netdev_vf, vfio_vf = sorted(vfs)[:2]
        ok = allocated_claim(resource_api, namespace, "netdev", node, [netdev_vf])
        params = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig", "mode": "vfio-pci"}
        opaque = {"driver": "patchbay.dev", "parameters": params}
        config = [{"source": "FromClaim", "requests": ["req-0"], "opaque": opaque}]
        bad = allocated_claim(resource_api, namespace, "vfio", node, [vfio_vf], config=config)
        claims = [(namespace, "netdev", ok), (namespace, "vfio", bad)]
        result = kubelet.prepare(endpoint, claims)
        assert result[ok].error == "", result[ok].error
        assert "Read-only file system" in result[bad].error and str(sysfs) in result[bad].error
        records = recorded(proc.plugin_dir / "checkpoint.json")["claims"]
        assert set(records) == {ok}  # nothing of the failed claim kept
        assert {p.name for p in proc.cdi_root.glob("*.json")} == {
            f"k8s.patchbay.dev-claim_{ok}.json"
        }
        assert kubelet.unprepare(endpoint, claims)[ok].error == ""
    finally:
        hostile.proc.stop()
        subprocess.run(["umount", str(sysfs)], check=True)


def test_missing_kubelet_directories_are_created(
    hostile: Hostile, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    kubelet_root = hostile.base / "kubelet"  # the kubelet has not made its directories yet
    registry, plugin_dir = kubelet_root / "plugins_registry", kubelet_root / "plugins" / "pb"
    proc = hostile.start(f"--registry-dir={registry}", f"--plugin-dir={plugin_dir}", library=True)
    kubelet = Kubelet(registry)

    def answering() -> bool:
        assert proc.alive, proc.log_tail()
        try:
            return bool(registry.is_dir() and kubelet.get_info().endpoint)
        except (AssertionError, grpc.RpcError):
            return False

    wait_for("plugin registered in the new directory", answering, timeout=30)
    endpoint = kubelet.get_info().endpoint
    assert Path(endpoint).parent == plugin_dir
    wait_for("GPUs published", lambda: "gpu-0" in published(resource_api, proc.node_name), 30)
    uid = allocated_claim(resource_api, namespace, "c", proc.node_name, ["gpu-0"])
    assert kubelet.prepare(endpoint, [(namespace, "c", uid)])[uid].error == ""
    assert uid in recorded(plugin_dir / "checkpoint.json")["claims"]
    assert kubelet.unprepare(endpoint, [(namespace, "c", uid)])[uid].error == ""
