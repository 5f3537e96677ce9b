"""A graceful stop leaves the checkpoint file current (issue 36).

A prepare appends its record to the checkpoint's journal instead of
writing the whole file (``driver.journal``),
and builds before the journal read only the file (format 1): a rollback that
found a journal the file lacks would drop the CDI specs of the claims it does
not know. So the plugin compacts the journal when it stops on SIGTERM, after
the calls in flight. This runs the real plugin process, prepares claims until
the journal is in use, and sends SIGTERM while the last prepare is in flight
(held on the cross-process prepare lock, which the test takes as a rolling
update's other plugin pod would). The plugin runs its real entry point with
the compaction at rest put an hour off (``COMPACT_AT_REST_S``, one second,
would otherwise race the shutdown, which can take as long): only the stop's
compaction can leave the file current.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client

from driver.checkpoint import CHECKPOINT_VERSION
from driver.journal import journal_path
from fabric.simhost.topologies import TOPOLOGIES
from plugin.sockets import LOCK_FILE_NAME, checkpoint_file
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.kubelet import our_slices, wait_registered
from tests.integration.own_node import own_node
from tests.integration.rest_compaction import argv_without_rest_compaction
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def lock_waiter(lock: Path, pid: int) -> bool:
    """Whether process ``pid`` is blocked in ``flock`` on ``lock`` (the
    kernel's table of locks, ``/proc/locks``: a waiter's line has ``->``)."""
    st = lock.stat()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields or fields[2] != "FLOCK":
            continue
        waiter_pid, device = int(fields[5]), fields[6]
        if waiter_pid == pid and int(device.rsplit(":", 1)[1]) == st.st_ino:
            return True
    return False


def test_sigterm_compacts_the_journal(
    local_cluster: LocalCluster,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(PluginProcess, "argv", argv_without_rest_compaction)
    # 4 GPUs and 16 VFs: a claim each for 4 of them.
    with own_node(local_cluster, core, "stop-node", TOPOLOGIES["2x-h100-nic"]()) as own:
        vf_config = own.base / "vf.yaml"
        vf_config.write_text("pfs:\n  - vendorID: '15b3'\n")
        # A pod UID: the rolling-update mode, with its cross-process prepare lock.
        plugin = own.plugin(f"--vf-config={vf_config}", f"--pod-uid={uuid.uuid4()}").start()
        kubelet = wait_registered(plugin)
        endpoint = kubelet.get_info().endpoint

        def device_names() -> list[str] | None:
            names = [d.name for s in our_slices(resource_api, own.name) for d in s.spec.devices]
            return names if len(names) >= 4 else None

        names = wait_for("devices published", device_names, timeout=30)[:4]
        claims = [
            (namespace, f"c{i}", allocated_claim(resource_api, namespace, f"c{i}", own.name, [n]))
            for i, n in enumerate(names)
        ]
        first = kubelet.prepare(endpoint, claims[:2])
        assert [r.error for r in first.values()] == ["", ""]
        path = checkpoint_file(plugin.plugin_dir)
        journal = journal_path(path)
        assert journal.exists(), "the prepares were journaled"
        # The last call (two more claims) waits on the prepare lock the test
        # holds; SIGTERM comes meanwhile.
        lock = plugin.plugin_dir / LOCK_FILE_NAME
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with ThreadPoolExecutor(1) as pool:
                last = pool.submit(kubelet.prepare, endpoint, claims[2:])
                assert plugin.proc is not None
                pid = plugin.proc.pid
                wait_for("the last prepare waiting on the lock", lambda: lock_waiter(lock, pid))
                os.kill(pid, signal.SIGTERM)
                # Registration goes first; the DRA server waits for the call in flight.
                wait_for(
                    "registration socket removed",
                    lambda: not list(plugin.registry_dir.glob("*.sock")),
                )
                fcntl.flock(fd, fcntl.LOCK_UN)
                answered = last.result(timeout=45)
        finally:
            os.close(fd)
        assert [r.error for r in answered.values()] == ["", ""]
        assert plugin.wait_exit(30) == 0, plugin.log_tail()
        # The file every build reads holds every claim, completed; no journal.
        assert not journal.exists(), "the journal was not compacted at the stop"
        stored = json.loads(path.read_bytes())
        assert stored["version"] == CHECKPOINT_VERSION
        assert {u: c["state"] for u, c in stored["claims"].items()} == {
            uid: "PrepareCompleted" for _, _, uid in claims
        }
