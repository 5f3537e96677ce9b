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
import json
import os
import shutil
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
SUNFISH = SHARED / "sunfish"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "patchbay"
# What each service's upstream requirements.txt names, pinned.
MOCKUP_SERVER_PACKAGES = ("requests==2.32.3", "grequests==0.7.0")
# Sunfish's library pins Flask 2.3 (its poetry.lock: flask 2.3.3, werkzeug 3.0.6).
SUNFISH_PACKAGES = ("flask==2.3.3", "werkzeug==3.0.6", "requests==2.32.3")
# Sunfish's three apps: the service and its two agents, each with the mockup tree it
# starts from (upstream's server/mockups) and the port upstream hard-codes.
SUNFISH_APPS = (("app_sunfish_server.py", "server_start_Resources", 5000),
                ("app_fabric_mgr.py", "fm_agent_Resources", 5001),
                ("app_appliance_mgr.py", "am_agent_Resources", 5002))  # fmt: skip
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
    try:
        tmp.rename(root)
    except OSError:  # another process (an xdist worker) made it meanwhile: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return python


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


def _sunfish_tree(work: Path, ports: dict[int, int]) -> Path:
    """A copy of Sunfish's server with upstream's hard-coded ports (5000-5002, in the
    agents' event and registration URLs and each ``app.run()``) replaced by ours."""
    server = work / "server"
    shutil.copytree(SUNFISH / "server", server, ignore=shutil.ignore_patterns("sc24-PoC",
                    "nvmeof-mockups", "utils_resources", "scripts", "static"))  # fmt: skip
    for app, _, upstream in SUNFISH_APPS:
        text = (server / app).read_text()
        for old, new in ports.items():
            text = text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        run = f'app.run(debug=False, host="127.0.0.1", port={ports[upstream]})'
        (server / app).write_text(text.replace("app.run(debug=False)", run))
    return server


@contextlib.contextmanager
def sunfish(work: Path) -> Iterator[str]:
    """OFA Sunfish with its fabric-manager and appliance-manager agents, each agent
    registered and its resources uploaded (upstream's own steps: ``POST
    /AgentRegister``, ``POST /AgentUpload``); yields the service's base URL."""
    if not (SUNFISH / "server" / "app_sunfish_server.py").is_file():
        missing_prerequisite(f"OFA Sunfish is not at {SUNFISH}")
    python = tool_venv("sunfish", SUNFISH_PACKAGES)
    ports = {upstream: free_port() for _, _, upstream in SUNFISH_APPS}
    server = _sunfish_tree(work, ports)
    env = os.environ | {"PYTHONPATH": f"{SUNFISH / 'library'}:{server}"}
    with contextlib.ExitStack() as stack:
        for app, resources, upstream in SUNFISH_APPS:
            run = work / app.removesuffix(".py")
            shutil.copytree(server / "mockups" / resources, run / "Resources")
            url = f"http://127.0.0.1:{ports[upstream]}"
            argv = [str(python), str(server / app)]
            stack.enter_context(serving_process(argv, url, run, work / f"{app}.log", env))
        for _, _, upstream in SUNFISH_APPS[1:]:
            for step in ("AgentRegister", "AgentUpload"):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{ports[upstream]}/{step}", method="POST",
                    data=b"{}", headers={"Content-Type": "application/json"},
                )  # fmt: skip
                with urllib.request.urlopen(request, timeout=60) as r:
                    answer = json.loads(r.read() or b"null")
                if r.status != 200:
                    raise AssertionError(f"Sunfish agent {upstream}: {step} answered {answer}")
        yield f"http://127.0.0.1:{ports[5000]}"
