"""Real Redfish services for the fabric client's tiers: DMTF's mockup server, OFA Sunfish.

Why a module: the client must be shown against the counterparts the
standard's own bodies come from, not only against our doubles. Each runs as
its upstream ships it (``../shared/redfish/mockup-server``,
``../shared/sunfish``), as a process on a loopback port from
:mod:`tests.harness.ports`, with its Python packages in a virtual
environment of its own under ``~/.cache/patchbay/venv-<name>-<hash>``,
created here on first use from PyPI (pinned versions; seconds), so a
newcomer's ``make test`` needs nothing installed by hand and the project's
own environment never carries them (Sunfish pins Flask 2.3). A service that
cannot be set up skips its tests, saying why (a failure under CI=true:
``missing_prerequisite``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.cluster_fixtures import missing_prerequisite
from tests.harness.poll import until
from tests.harness.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
MOCKUP_SERVER = SHARED / "redfish" / "mockup-server" / "redfishMockupServer.py"
MOCKUPS = SHARED / "redfish" / "mockups"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "patchbay"
# What each service's upstream requirements.txt names, pinned.
MOCKUP_SERVER_PACKAGES = ("requests==2.32.3", "grequests==0.7.0")
STARTUP_S = 60.0  # a cold start on a busy 2-core machine; it is seconds otherwise


def tool_venv(name: str, packages: tuple[str, ...]) -> Path:
    """The python of a virtual environment holding ``packages``, made if missing."""
    digest = hashlib.sha256("\n".join((sys.version, *packages)).encode()).hexdigest()[:12]
    root = CACHE / f"venv-{name}-{digest}"
    python = root / "bin" / "python"
    if (root / ".complete").exists():
        return python
    tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True,
                       capture_output=True)  # fmt: skip
        subprocess.run([str(tmp / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        *packages], check=True, capture_output=True, timeout=600)  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        out = getattr(exc, "stderr", b"") or b""
        missing_prerequisite(f"{name}: installing {' '.join(packages)} into {tmp} failed: "
                             f"{exc} {out.decode(errors='replace')[-400:]}")  # fmt: skip
    (tmp / ".complete").touch()
    with contextlib.suppress(OSError):  # another process may have made it meanwhile
        tmp.rename(root)
    return python if root.exists() else tmp / "bin" / "python"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def serving_process(
    argv: list[str], url: str, cwd: Path, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run ``argv`` until the with-block ends; yields ``url`` once its service root answers."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip
    try:
        if not until(lambda: proc.poll() is not None or _answers(f"{url}/redfish/v1/"),
                     timeout=STARTUP_S, interval=0.1) or proc.poll() is not None:  # fmt: skip
            tail = log.read_text(errors="replace")[-2000:]
            raise AssertionError(f"{argv[1]} did not serve {url}/redfish/v1/: {tail}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def mockup_server(mockup: Path, log: Path) -> Iterator[str]:
    """DMTF's Redfish-Mockup-Server serving ``mockup`` (short form: its top-level
    ``index.json`` is ``/redfish/v1``) on a loopback port; yields its base URL."""
    if not MOCKUP_SERVER.is_file():
        missing_prerequisite(f"DMTF's mockup server is not at {MOCKUP_SERVER}")
    python = tool_venv("mockup-server", MOCKUP_SERVER_PACKAGES)
    port = free_port()
    argv = [str(python), str(MOCKUP_SERVER), "-H", "127.0.0.1", "-p", str(port), "-S",
            "-D", str(mockup)]  # fmt: skip
    with serving_process(argv, f"http://127.0.0.1:{port}", MOCKUP_SERVER.parent, log) as url:
        yield url
