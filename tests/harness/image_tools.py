"""The external tools tests/harness/images.py drives: debootstrap and buildah.

debootstrap makes the Debian root filesystem of the patchbay image's base,
trimmed like Debian's slim images. buildah builds hack/image/Dockerfile on
that base without a daemon: its storage (vfs, so nothing is ever mounted on
the host) lives in the build's work directory and goes with it, RUN steps use
chroot isolation and the host's network, and the image is smoke-tested (the
console scripts start) before it is pushed to an OCI layout. Both need root.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

log = logging.getLogger(__name__)

# Trimmed from the base like Debian's slim images (copyright files are kept),
# also for packages installed later (the dpkg excludes go into the image).
SLIM = ("usr/share/man/", "usr/share/info/", "usr/share/groff/", "usr/share/lintian/")
SLIM_DPKG = "".join(f"path-exclude /{p}*\n" for p in SLIM) + (
    "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
    "path-exclude /usr/share/locale/*\npath-include /usr/share/locale/locale.alias\n"
)
CONTAINER_CA = "/etc/ssl/certs/ca-certificates.crt"
# buildah 1.28 (containers/image) keeps its blob-info cache here for root
# whatever --root says; removed after the build when it was not there before.
SYSTEM_BLOB_CACHE = Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb")


def run(cmd: list[str], logfile: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run cmd; its output is appended to logfile (tail raised on failure) or returned.

    Interrupted (Ctrl-C, or SIGTERM, which tests/harness/images.py turns into SystemExit),
    it stops cmd with SIGTERM first so that buildah and debootstrap clean up.
    """
    log.debug("+ %s", " ".join(cmd))
    with open(logfile or os.devnull, "a") as out:
        out.write(f"+ {' '.join(cmd)}\n")
        out.flush()
        sink = subprocess.PIPE if logfile is None else out
        err = subprocess.PIPE if logfile is None else subprocess.STDOUT
        with subprocess.Popen(cmd, stdout=sink, stderr=err, text=True, env=env) as proc:
            try:
                stdout, stderr = proc.communicate()
            except BaseException:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
    if proc.returncode != 0:
        what = f"{' '.join(cmd[:2])} failed (rc {proc.returncode})"
        if logfile is None:
            raise RuntimeError(f"{what}: {stderr.strip()}")
        tail = "\n".join(logfile.read_text().splitlines()[-25:])
        raise RuntimeError(f"{what}; from {logfile}:\n{tail}")
    return stdout or ""


def need(*tools: str, root: bool = False) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        hint = "apt-get install gcc libc6-dev" if "gcc" in missing else "`make node-prereqs`"
        raise RuntimeError(f"images: missing {' '.join(missing)}; {hint}")
    if root and os.geteuid() != 0:
        raise RuntimeError(f"images: {' '.join(tools)} need root")


def debootstrap(
    rootfs: Path, release: str, mirror: str, packages: tuple[str, ...], logfile: Path
) -> None:
    """A minbase Debian root filesystem with packages, plus the slim dpkg excludes."""
    need("debootstrap", root=True)
    include = f"--include={','.join(packages)}"
    run(["debootstrap", "--variant=minbase", include, release, str(rootfs), mirror], logfile)
    (rootfs / "etc/dpkg/dpkg.cfg.d/patchbay-slim").write_text(SLIM_DPKG)


def keep_in_base(info: tarfile.TarInfo) -> bool:
    """Which debootstrap files go into the base layer."""
    name = info.name
    if name in ("etc/resolv.conf", "etc/hostname") or name.startswith(("dev/", "tmp/")):
        return False  # the host's copies, or the runtime's to provide
    if name.startswith(("var/cache/apt/", "var/lib/apt/lists/")):
        return not info.isfile() or name.endswith("/lock")
    if name.startswith("usr/share/doc/"):
        return name.count("/") == 3 or name.endswith("/copyright")
    if name.startswith("usr/share/locale/"):
        return name.endswith("locale.alias")
    return not name.startswith(SLIM)


def buildah_build(
    work: Path,
    *,
    base_archive: Path,
    base_name: str,
    dockerfile: Path,
    context: Path,
    tag: str,
    checks: tuple[tuple[str, ...], ...],
    host_ca: Path,
    logfile: Path,
) -> Path:
    """Build dockerfile FROM base (BASE build argument); returns the OCI layout it is pushed to."""
    need("buildah", root=True)
    # work is <images dir>/tmp/<build>: the note outlives the work dir.
    with _no_system_leftovers(work.parent.parent / ".system-paths"):
        (work / "tmp").mkdir()
        policy = work / "policy.json"
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        store = ["--root", f"{work}/root", "--runroot", f"{work}/run", "--storage-driver", "vfs"]
        env = {**os.environ, "TMPDIR": str(work / "tmp"), "BUILDAH_ISOLATION": "chroot"}
        sig = f"--signature-policy={policy}"

        def buildah(*args: str, logged: bool = True) -> str:
            return run(["buildah", *store, *args], logfile if logged else None, env)

        pulled = buildah("pull", "-q", sig, f"oci-archive:{base_archive}", logged=False)
        image_id = pulled.split()[-1]
        buildah("tag", image_id, base_name)
        # pip in the RUN steps trusts what the host trusts (say a TLS proxy's CA);
        # a bind mount, so nothing of the host is committed.
        ca = ["--volume", f"{host_ca}:{CONTAINER_CA}:ro"] if host_ca.is_file() else []
        log.info("images: buildah bud %s FROM %s (log: %s)", dockerfile.name, base_name, logfile)
        bud = ["bud", sig, "--isolation=chroot", "--network=host", "--pull=never", *ca]
        build_arg = f"--build-arg=BASE={base_name}"
        buildah(*bud, build_arg, "-f", str(dockerfile), "-t", tag, str(context))
        name = buildah("from", "--pull=never", "--name", f"smoke-{os.getpid()}", tag, logged=False)
        try:
            for check in checks:
                buildah("run", "--isolation=chroot", name.strip(), "--", *check)
        finally:
            buildah("rm", name.strip(), logged=False)
        layout = work / "layout"
        buildah("push", sig, tag, f"oci:{layout}:{tag.rsplit(':', 1)[-1]}")
        return layout


@contextmanager
def _no_system_leftovers(marker: Path) -> Iterator[None]:
    """Remove the system blob cache afterwards if it was not there before.

    The paths created are noted in marker first, so that a build killed before
    its cleanup has them removed by the next one (in the same cache).
    """
    cache = SYSTEM_BLOB_CACHE
    # Builds in other cache roots must not see each other's cache as the
    # host's: they take turns, holding a lock on /var/lib itself (no file made).
    lock = os.open(cache.parent.parent.parent, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_listed(marker)
        created = [p for p in (cache, cache.parent, cache.parent.parent) if not p.exists()]
        marker.write_text("".join(f"{p}\n" for p in created))
        try:
            yield
        finally:
            _remove_listed(marker)
    finally:
        os.close(lock)


def _remove_listed(marker: Path) -> None:
    if not marker.exists():
        return
    for line in marker.read_text().splitlines():
        with suppress(OSError):
            path = Path(line)
            path.unlink() if path.is_file() else path.rmdir()
    marker.unlink()
