"""Build the real-node tier's container images without a registry or a daemon.

A real node (containerd + kubelet) on our machines can pull nothing, so every
image it runs is imported from an OCI archive built here (ARCHITECTURE.md §11):

- pause: registry.k8s.io/pause (the sandbox image), hack/image/pause.c
  compiled static;
- busybox: the workload image, Debian's busybox-static plus applet links;
- patchbay: hack/image/Dockerfile itself, built by `buildah bud` on a Debian
  bookworm base that debootstrap makes (the Dockerfile's BASE argument), so
  the definition kind users build with Docker is the one we test.

pause, busybox and the base are written by tests/harness/image_oci.py (plain tars);
only the patchbay image needs buildah, whose storage lives in a temporary
directory under the cache and is removed after each build. Every archive sits
in <cache>/images, named by a hash of its inputs, written under a temporary
name and renamed when complete; the base is keyed by its Debian release and
package list only, so code changes rebuild the top image alone.

    python3 hack/images.py build [--only NAME]   build what is missing
    python3 hack/images.py path NAME             print NAME's archive path
    python3 hack/images.py list                  names, paths, sizes
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import signal
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import image_oci as oci
from tests.harness import image_tools as tools

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# containerd 2.4's built-in sandbox image; the archive carries both names so a
# node finds its pause image whether or not its config pins PAUSE_IMAGE.
PAUSE_ALIASES = ("registry.k8s.io/pause:3.10.2",)
# The name the examples use (busybox:1.35 on Docker Hub elsewhere): IfNotPresent finds it.
BUSYBOX_IMAGE = "busybox:1.35"
PATCHBAY_IMAGE = f"patchbay:{VERSION}"  # stored as docker.io/library/patchbay:<version>
BASE_IMAGE = "localhost/patchbay-base:bookworm"
IMAGES = ("pause", "busybox", "patchbay")

PAUSE_SRC = REPO / "hack" / "image" / "pause.c"
PAUSE_CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")
BUSYBOX_BIN = Path("/bin/busybox")
DEBIAN_RELEASE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "libudev1", "ca-certificates")
DOCKERFILE = REPO / "hack" / "image" / "Dockerfile"
# What the Dockerfile COPYs (its .dockerignore lets only these through).
PATCHBAY_INPUTS = (".dockerignore", "pyproject.toml", "README.md", "driver", "plugin", "fabric")
HOST_CA = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PATCHBAY_SCRIPTS = ("patchbay-plugin", "patchbay-fabric", "patchbay-controller")
# libudev1 is there and pyudev finds it.
PYUDEV_CHECK = ("python3", "-c", "import pyudev; pyudev.Context()")


def cache_root() -> Path:
    if root := os.environ.get("K8S_CACHE_ROOT"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "patchbay"


def images_dir() -> Path:
    return cache_root() / "images"


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:16]


def _tree(rels: tuple[str, ...]) -> bytes:
    """A digest of files (path, exec bit, content) as COPY would see them."""
    h = hashlib.sha256()
    for rel in rels:
        top = REPO / rel
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts:
                mode = "x" if os.access(f, os.X_OK) else "-"
                h.update(f"{f.relative_to(REPO)}\0{mode}\0".encode() + f.read_bytes() + b"\0")
    return h.digest()


@dataclass(frozen=True)
class Spec:
    stem: str  # archive file name: <stem>-<key>.oci.tar
    names: tuple[str, ...]  # image references the archive carries (part of the key)
    inputs: Callable[[], tuple[str | bytes, ...]]  # the rest of the key; bump the recipe
    build: Callable[[Path, Path], None]  # (work dir, archive to write)
    needs: tuple[str, ...] = ()

    def file(self) -> str:
        return f"{self.stem}-{_key(*self.names, *self.inputs())}.oci.tar"


SPECS: dict[str, Spec] = {}


def archive_path(name: str) -> Path:
    """Where NAME's archive is (or will be) for the current inputs."""
    return images_dir() / SPECS[name].file()


def build(name: str) -> Path:
    """Build NAME's archive unless it is already cached; returns its path."""
    spec, path = SPECS[name], archive_path(name)
    if path.exists():
        return path
    for dep in spec.needs:
        build(dep)
    with _locked():
        if path.exists():
            return path
        work = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=images_dir() / "tmp"))
        part = path.with_name(f".{path.name}.part")
        start = time.monotonic()
        log.info("images: building %s (%s)", name, ", ".join(spec.names))
        try:
            spec.build(work, part)
            part.replace(path)
            if spec.file() != path.name:  # someone edited the inputs meanwhile
                log.warning("images: %s inputs changed during the build; rebuilt next time", name)
        finally:
            part.unlink(missing_ok=True)
            oci.remove_tree(work)
        size = path.stat().st_size / 2**20
        took = time.monotonic() - start
        log.info("images: %s built in %.1fs (%.1f MiB): %s", name, took, size, path)
        _prune(name, path)
    return path


def build_all() -> dict[str, Path]:
    """Build (or reuse) the pause, busybox and patchbay archives; name -> archive path."""
    return {name: build(name) for name in IMAGES}


@contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time; whatever a killed builder left behind is removed first."""
    top = images_dir()
    (top / "tmp").mkdir(parents=True, exist_ok=True)
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in [*(top / "tmp").iterdir(), *top.glob(".*.part")]:
            log.info("images: removing %s left by an interrupted build", stale)
            oci.remove_tree(stale) if stale.is_dir() else stale.unlink()
        yield


def _prune(name: str, keep: Path, older: int = 1) -> None:
    """Keep the new archive and the `older` most recent ones of the same image."""
    others = [p for p in images_dir().glob(f"{SPECS[name].stem}-*.oci.tar") if p != keep]
    for old in sorted(others, key=lambda p: p.stat().st_mtime, reverse=True)[older:]:
        log.info("images: removing old %s archive %s", name, old.name)
        old.unlink()


def _logfile(name: str) -> Path:
    (images_dir() / "logs").mkdir(exist_ok=True)
    path = images_dir() / "logs" / f"{name}.log"
    path.write_text("")
    return path


def _write_image(
    work: Path, out: Path, layers: list[Path], config: dict[str, Any], names: tuple[str, ...]
) -> None:
    layout = oci.Layout(work / "layout")
    layout.image([layout.layer(tar) for tar in layers], config, names)
    layout.write_index()
    oci.pack(layout.root, out)


def _build_pause(work: Path, out: Path) -> None:
    tools.need("gcc")
    binary = work / "pause"
    tools.run(["gcc", *PAUSE_CFLAGS, "-o", str(binary), str(PAUSE_SRC)], _logfile("pause"))
    with oci.LayerTar(work / "layer.tar") as layer:
        layer.host_file("pause", binary)
    config = {"Entrypoint": ["/pause"]}
    _write_image(work, out, [work / "layer.tar"], config, SPECS["pause"].names)


def _build_busybox(work: Path, out: Path) -> None:
    applets = set(tools.run([str(BUSYBOX_BIN), "--list-full"]).split()) - {"bin/busybox", "linuxrc"}
    with oci.LayerTar(work / "layer.tar") as layer:
        for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc"):
            layer.dir(d)
        layer.dir("root", 0o700)
        layer.dir("tmp", 0o1777)
        layer.host_file("bin/busybox", BUSYBOX_BIN)
        for applet in sorted(applets):  # what `busybox --install -s` makes
            layer.symlink(applet, "/bin/busybox")
        layer.file(
            "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
        )
        layer.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    config = {"Env": [ENV_PATH], "Cmd": ["sh"]}
    _write_image(work, out, [work / "layer.tar"], config, SPECS["busybox"].names)


def _build_base(work: Path, out: Path) -> None:
    log.info("images: debootstrap %s (about 1.5 min)", DEBIAN_RELEASE)
    rootfs = work / "rootfs"
    tools.debootstrap(rootfs, DEBIAN_RELEASE, DEBIAN_MIRROR, BASE_PACKAGES, _logfile("base"))
    with oci.LayerTar(work / "layer.tar") as layer:
        layer.tree(rootfs, tools.keep_in_base)
    config = {"Env": [ENV_PATH, "LANG=C.UTF-8"], "Cmd": ["python3"]}
    _write_image(work, out, [work / "layer.tar"], config, SPECS["base"].names)


def _build_patchbay(work: Path, out: Path) -> None:
    layout = tools.buildah_build(
        work,
        base_archive=archive_path("base"),
        base_name=BASE_IMAGE,
        dockerfile=DOCKERFILE,
        context=REPO,
        tag=f"localhost/{PATCHBAY_IMAGE}",
        checks=(*((script, "--help") for script in PATCHBAY_SCRIPTS), PYUDEV_CHECK),
        host_ca=HOST_CA,
        logfile=_logfile("patchbay"),
    )
    oci.rename_layout(layout, SPECS["patchbay"].names)
    oci.pack(layout, out)


# What each archive's key covers besides its names; a "<name>/<n>" recipe
# version is bumped when its build changes.
def _pause_inputs() -> tuple[str | bytes, ...]:
    return ("pause/1", PAUSE_SRC.read_bytes(), *PAUSE_CFLAGS)


def _busybox_inputs() -> tuple[str | bytes, ...]:
    return ("busybox/1", BUSYBOX_BIN.read_bytes())


def _base_inputs() -> tuple[str | bytes, ...]:
    return ("base/1", DEBIAN_RELEASE, *BASE_PACKAGES, tools.SLIM_DPKG)


def _patchbay_inputs() -> tuple[str | bytes, ...]:
    base = SPECS["base"].file()  # a new base means a new top
    return ("patchbay/1", DOCKERFILE.read_bytes(), _tree(PATCHBAY_INPUTS), base)


SPECS.update(
    pause=Spec("pause", (PAUSE_IMAGE, *PAUSE_ALIASES), _pause_inputs, _build_pause),
    busybox=Spec("busybox", (BUSYBOX_IMAGE,), _busybox_inputs, _build_busybox),
    base=Spec(f"base-{DEBIAN_RELEASE}", (BASE_IMAGE,), _base_inputs, _build_base),
    patchbay=Spec(
        f"patchbay-{VERSION}", (PATCHBAY_IMAGE,), _patchbay_inputs, _build_patchbay, ("base",)
    ),
)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build").add_argument("--only", choices=sorted(SPECS))
    sub.add_parser("path").add_argument("name", choices=sorted(SPECS))
    sub.add_parser("list")
    args = parser.parse_args(argv)
    if args.cmd == "path":
        path = archive_path(args.name)
        print(path)
        return 0 if path.exists() else 1
    if args.cmd == "list":
        for name in (*IMAGES, "base"):
            path = archive_path(name)
            size = f"{path.stat().st_size / 2**20:.1f} MiB" if path.exists() else "not built"
            print(f"{name:9} {size:>10}  {path}  {' '.join(SPECS[name].names)}")
        return 0
    start = time.monotonic()
    try:
        paths = {args.only: build(args.only)} if args.only else build_all()
    except (RuntimeError, OSError) as e:
        log.error("%s", e)
        return 1
    except KeyboardInterrupt:
        return 130
    for name, path in paths.items():
        log.info("images: %-8s %s", name, path)
    log.info("images: done in %.2fs", time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
