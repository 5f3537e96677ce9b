"""A rollback runs the previous release's plugin over what today's left (issue 36).

Today's plugin journals each change of its checkpoint and compacts the
journal into the file at rest, at start and at a graceful stop; the
previous release (``tests.previous_release.RELEASE``) reads only the file,
and at its start removes the CDI spec of every claim its file does not
hold. This runs both as processes on one simulated node, as a DaemonSet
rollback does: today's plugin prepares claims and gets SIGTERM at once (its
compaction at rest put off, so only the stop's compaction can make the file
current); then the previous release's plugin, that release's code taken
from the repository's history, starts on the same directories. It must hold
every claim as prepared: their CDI specs kept through its start-up (which
ends before it registers), a repeated prepare answered with the same CDI
devices, and its unprepare removing each claim's spec and record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from driver.journal import journal_path
from fabric.simhost.topologies import TOPOLOGIES
from plugin.sockets import checkpoint_file
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.kubelet import our_slices, wait_registered
from tests.integration.own_node import own_node
from tests.integration.rest_compaction import argv_without_rest_compaction
from tests.kube.claims import allocated_claim
from tests.previous_release import RELEASE, plugin_tree

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def test_the_previous_release_takes_over_the_claims_a_graceful_stop_left(
    local_cluster: LocalCluster,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    previous = plugin_tree(tmp_path / "previous")
    with own_node(local_cluster, core, "rollback-node", TOPOLOGIES["2x-h100-nic"]()) as own:
        vf_config = own.base / "vf.yaml"
        vf_config.write_text("pfs:\n  - vendorID: '15b3'\n")
        cdi = own.base / "cdi"

        def device_names() -> list[str] | None:
            names = [d.name for s in our_slices(resource_api, own.name) for d in s.spec.devices]
            return names if len(names) >= 3 else None

        with monkeypatch.context() as patch:
            patch.setattr(PluginProcess, "argv", argv_without_rest_compaction)
            today = own.plugin(f"--vf-config={vf_config}", log_name="today").start()
            kubelet = wait_registered(today)
            endpoint = kubelet.get_info().endpoint
            names = wait_for("devices published", device_names, timeout=30)[:3]
            claims = [
                (
                    namespace,
                    f"r{i}",
                    allocated_claim(resource_api, namespace, f"r{i}", own.name, [n]),
                )
                for i, n in enumerate(names)
            ]
            prepared = kubelet.prepare(endpoint, claims)
            assert {u: r.error for u, r in prepared.items()} == {u: "" for _, _, u in claims}
            devices = {u: [list(d.cdi_device_ids) for d in r.devices] for u, r in prepared.items()}
            specs = sorted(p.name for p in cdi.glob("*.json"))
            assert len(specs) == len(claims)
            path = checkpoint_file(today.plugin_dir)
            assert journal_path(path).exists(), "the prepares were journaled"
            today.stop()  # SIGTERM, as a rollback's pod deletion sends

        old = own.plugin(
            f"--vf-config={vf_config}",
            log_name=f"release-{RELEASE}",
            # The release's packages, not this tree's (the plugin starts in it).
            extra_env={"PYTHONPATH": str(previous), "PYTHONSAFEPATH": "1"},
        ).start()
        kubelet = wait_registered(old)
        endpoint = kubelet.get_info().endpoint
        assert sorted(p.name for p in cdi.glob("*.json")) == specs, old.log_tail()
        again = kubelet.prepare(endpoint, claims)
        assert {
            u: (r.error, [list(d.cdi_device_ids) for d in r.devices]) for u, r in again.items()
        } == {u: ("", devices[u]) for _, _, u in claims}
        done = kubelet.unprepare(endpoint, claims)
        assert {u: r.error for u, r in done.items()} == {u: "" for _, _, u in claims}
        assert not list(cdi.glob("*.json")), old.log_tail()
        assert json.loads(path.read_bytes())["claims"] == {}
        # The release's code ran, not this tree's: it still reached the
        # apiserver through aiohttp, whose compiled parts today's plugin never loads.
        assert old.proc is not None
        assert b"/aiohttp/" in Path(f"/proc/{old.proc.pid}/maps").read_bytes()
