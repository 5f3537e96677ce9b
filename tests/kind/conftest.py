"""The kind tier's session: hack/kind/up.sh as a user runs it, down.sh at the end.

Why a tier of its own: kind is the path a user with Docker takes first, and it
is the only one where the nodes are containers that Docker and kind make.
Here the Docker daemon is the private one hack/kind/dockerd.sh starts (no
host-wide network plumbing) and the node image is assembled offline
(hack/kind/node-image.sh).

Before up.sh the session installs a counting rule on the kind network's
bridge (named by hack/kind/common.sh): a packet from the kind nodes to any
address outside kind's own subnet and pod CIDR hits it, so its counter says
whether anything left the run's own network. It also records every host
setting that Docker or the kubelets could change, for the last test to compare.

Under CI=true a missing prerequisite fails the tier; elsewhere it skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.kind.hoststate import HostState, guard_count, guard_install, guard_remove

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "run" / "kind-tier"
# The examples the tier checks; up.sh applies exactly these.
EXAMPLES = ("single-gpu", "mig-1g", "gpu-vf-pair")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kind: a kind cluster (Docker, kind, the chart with helm)")


@dataclass
class KindTier:
    """The running cluster: its kubeconfig and how to reach Docker and the nodes."""

    env: dict[str, str]
    before: HostState
    down_done: bool = False
    figures: dict[str, str] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def kubectl(self, *args: str) -> str:
        return self.run(self.env["K8S_BIN_DIR"] + "/kubectl", *args)

    def down(self) -> None:
        if not self.down_done:
            self.down_done = True
            self.run(str(REPO / "hack/kind/down.sh"))


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "the kind tier needs root (dockerd, debootstrap, iptables)"
    for tool in ("go", "iptables", "flock"):
        if shutil.which(tool) is None:
            return f"the kind tier needs {tool!r} on PATH"
    if shutil.which("dockerd") is None and shutil.which("apt-get") is None:
        return "the kind tier needs dockerd or apt-get (Debian's docker.io)"
    return None


def _make_env() -> dict[str, str]:
    out = subprocess.run(
        ["make", "-s", "kind-env"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    env = dict(os.environ)
    for word in out.removeprefix("export ").split("' "):
        key, _, value = word.partition("=")
        env[key] = value.strip("'\n")
    env.update(KIND_RUN=str(RUN), KUBECONFIG=str(RUN / "kubeconfig"), EXAMPLES=" ".join(EXAMPLES))
    return env


@pytest.fixture(scope="session")
def kind_tier() -> Iterator[KindTier]:
    missing = _missing_prerequisite()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    env = _make_env()
    before = HostState.read()
    guard_install()
    tier = KindTier(env=env, before=before)
    try:
        up = subprocess.run(
            [str(REPO / "hack/kind/up.sh")], cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
        if up.returncode != 0:
            pytest.fail(f"hack/kind/up.sh failed:\n{up.stdout[-6000:]}")
        tier.figures["up"] = "\n".join(ln for ln in up.stdout.splitlines() if ln.startswith("up: "))
        if (RUN / "private-dockerd").exists():  # up.sh started the private dockerd
            line = tier.run(str(REPO / "hack/kind/dockerd.sh"), "env")
            env["DOCKER_HOST"] = line.strip().removeprefix("export DOCKER_HOST=")
        yield tier
    finally:
        try:
            tier.down()
        finally:
            counts = guard_count()
            guard_remove()
            tier.figures["guard"] = str(counts)
