"""Fixtures for the cluster tiers: one real control plane per test run.

Why this module exists: every e2e test needs the real etcd, kube-apiserver,
kube-scheduler and kube-controller-manager (tests/harness/cluster.py); starting them
once per session keeps the tier fast. Tests share that cluster, so each test
works in its own namespace and gives cluster-scoped objects unique names.

Prerequisites (Go to build the binaries, make, openssl) missing: under
`CI=true` the run FAILS; locally the tests are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests import figures, run_dirs
from tests.e2e.helpers import unique, wait_for
from tests.harness import cluster as localk8s
from tests.harness.cluster_proc import pid_alive

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
# Short on purpose: plugin sockets live below it and Unix socket paths must
# stay under 107 bytes wherever the checkout is. One per test session (the
# pid), so two sessions on one machine never stop each other's cluster; a
# dead session's directory is removed by the next one (_remove_stale).
# Under pytest-xdist each worker is a session of its own, with its own pid,
# control plane and directory (a fixed PATCHBAY_E2E_RUN_DIR gets the worker's
# name appended).
RUN_PREFIX = "/tmp/pbe-"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_FIXED = os.environ.get("PATCHBAY_E2E_RUN_DIR", "")
RUN_DIR = Path(
    (f"{_FIXED}-{_WORKER}" if _WORKER else _FIXED) if _FIXED else f"{RUN_PREFIX}{os.getpid()}"
)


def missing_prerequisite(reason: str) -> None:
    """Fail under CI=true, skip otherwise."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"e2e prerequisite missing (CI=true): {reason}", pytrace=False)
    pytest.skip(f"e2e prerequisite missing: {reason}")


def _binaries() -> Path:
    """The cached binaries, built first if needed (Go is only needed to build)."""
    for tool in ("make", "openssl"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"'{tool}' is not on PATH")
    try:
        bins = localk8s.bin_dir(build=True)  # a no-op when the cache is complete
    except localk8s.PrerequisiteError as err:
        missing_prerequisite(f"{err} (is Go >= 1.26 installed?)")
    missing = localk8s.missing_binaries(bins)
    if missing:
        missing_prerequisite(f"{bins} lacks {', '.join(missing)}")
    return bins


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[localk8s.LocalCluster]:
    bins = _binaries()
    _remove_stale()
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    cluster = localk8s.LocalCluster(RUN_DIR, bins)
    try:
        cluster.up()
    except localk8s.ComponentError as err:
        pytest.fail(f"local control plane did not start: {err}", pytrace=False)
    assert cluster.startup_seconds is not None
    record_startup("session", cluster.startup_seconds)
    yield cluster
    killed = cluster.down()
    assert killed == [], f"ignored SIGTERM at teardown and were killed: {killed}"
    run_dirs.done_with(RUN_DIR)


def _remove_stale() -> None:
    """Remove the run directories of test sessions that are gone (their
    components died with them: tests/harness/cluster.py starts them with a parent-death
    signal), keeping those of live sessions."""
    for path in Path(RUN_PREFIX).parent.glob(Path(RUN_PREFIX).name + "*"):
        pid = path.name.removeprefix(Path(RUN_PREFIX).name)
        if pid.isdigit() and path.stat().st_uid == os.getuid() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def record_startup(name: str, seconds: float) -> None:
    """A control plane's start-to-ready time, in the run's summary (tests.figures)."""
    who = f", {_WORKER}" if _WORKER else ""
    figures.keep(f"local control plane ({name}{who}) start-to-ready: {seconds:.1f}s")


@pytest.fixture(scope="session")
def api_client(local_cluster: localk8s.LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def resource_api(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount), removed afterwards."""
    name = unique("e2e")
    core.create_namespace({"metadata": {"name": name}})

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    wait_for(f"ServiceAccount default in {name}", has_default_sa, timeout=30)
    yield name
    # No kubelet finalises pods here: delete them for good before the namespace.
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)
