"""OCI image layouts and archives written with the standard library only.

tests/harness/images.py builds the pause and busybox images (and the Debian base of the
patchbay image) without buildah: a layer is a tar we write, an image is that
layer plus a config, a manifest and an index in an OCI layout, and the archive
is the layout in one tar, which `ctr images import` reads. Everything is
deterministic (fixed timestamps, root-owned entries, sorted members), so the
same inputs give the same digests.

containerd names an imported image after the index annotation
`io.containerd.image.name` (a full reference) and falls back to
`org.opencontainers.image.ref.name`; we write both with the full reference,
which is what `ctr images import` without `--base-name` and `kind load
image-archive` keep. Short names are normalised the way the CRI looks images up
(`patchbay:0.1.0` is stored as `docker.io/library/patchbay:0.1.0`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
CREATED = "1970-01-01T00:00:00Z"
_CHUNK = 1 << 20


def containerd_name(ref: str) -> str:
    """The full reference the CRI looks `ref` up by (docker.io/library/ for short names)."""
    first, sep, _ = ref.partition("/")
    if not sep:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def go_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


class LayerTar:
    """An uncompressed layer tar written to a file; added entries are root-owned, mtime 0."""

    def __init__(self, path: Path) -> None:
        self._tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 - closed by close()

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.strip("/"))
        info.type, info.mode, info.mtime = kind, mode, 0
        return info

    def dir(self, name: str, mode: int = 0o755) -> None:
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def host_file(self, name: str, src: Path, mode: int = 0o755) -> None:
        self.file(name, src.read_bytes(), mode)

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)

    def tree(self, root: Path, keep: Callable[[tarfile.TarInfo], bool]) -> None:
        """Add root's contents with their owners, modes and times; skip what keep() refuses."""

        def scrub(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if not keep(info):
                return None
            info.uname = info.gname = ""
            return info

        for child in sorted(root.iterdir()):
            self._tar.add(child, arcname=child.name, filter=scrub)

    def close(self) -> None:
        self._tar.close()

    def __enter__(self) -> LayerTar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Hashing:
    """A write-only file wrapper that hashes and counts what goes through it."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


class Layout:
    """An OCI image layout directory being filled: blobs, then images, then the index."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.manifests: list[dict[str, Any]] = []

    def blob(self, data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (self.blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    def layer(self, tar_path: Path) -> tuple[dict[str, Any], str]:
        """Gzip a layer tar into a blob; returns its descriptor and its diff ID."""
        part = self.blobs / f".{tar_path.name}.part"
        diff = hashlib.sha256()
        with open(tar_path, "rb") as src, open(part, "wb") as raw:
            hashed = _Hashing(raw)
            with gzip.GzipFile(fileobj=hashed, mode="wb", mtime=0, compresslevel=6) as gz:
                while chunk := src.read(_CHUNK):
                    diff.update(chunk)
                    gz.write(chunk)
        digest = hashed.sha.hexdigest()
        part.rename(self.blobs / digest)
        desc = {"mediaType": MEDIA_LAYER, "digest": f"sha256:{digest}", "size": hashed.size}
        return desc, f"sha256:{diff.hexdigest()}"

    def image(
        self, layers: list[tuple[dict[str, Any], str]], config: dict[str, Any], names: Iterable[str]
    ) -> dict[str, Any]:
        """Write an image's config and manifest and list it in the index under each name."""
        image_config = {
            "created": CREATED,
            "architecture": go_arch(),
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff for _, diff in layers]},
            "history": [{"created": CREATED, "created_by": "hack/images.py"} for _ in layers],
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": self.blob(_json(image_config), MEDIA_CONFIG),
            "layers": [desc for desc, _ in layers],
        }
        desc = self.blob(_json(manifest), MEDIA_MANIFEST)
        self.name(desc, names)
        return desc

    def name(self, manifest: dict[str, Any], names: Iterable[str]) -> None:
        """List a manifest in the index once per name, annotated for containerd."""
        base = {k: v for k, v in manifest.items() if k != "annotations"}
        base.setdefault("platform", {"architecture": go_arch(), "os": "linux"})
        for ref in names:
            full = containerd_name(ref)
            annotations = {NAME_ANNOTATION: full, REF_ANNOTATION: full}
            self.manifests.append({**base, "annotations": annotations})

    def write_index(self) -> None:
        index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": self.manifests}
        (self.root / "index.json").write_bytes(_json(index))
        (self.root / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))


def rename_layout(root: Path, names: Iterable[str]) -> None:
    """Rewrite a layout's index (as buildah pushes it) to carry our names on its one manifest."""
    index = json.loads((root / "index.json").read_text())
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ValueError(f"{root}: expected one manifest in index.json, found {len(manifests)}")
    layout = Layout(root)
    layout.name(manifests[0], names)
    layout.write_index()


def pack(root: Path, dest: Path) -> None:
    """Write the layout at root as an OCI archive (a plain tar) at dest."""
    with open(dest, "wb") as out:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in ("oci-layout", "index.json", "blobs", "blobs/sha256"):
                _pack_one(tar, root, rel)
            for blob in sorted((root / "blobs" / "sha256").iterdir()):
                _pack_one(tar, root, f"blobs/sha256/{blob.name}")
        out.flush()
        os.fsync(out.fileno())


def _pack_one(tar: tarfile.TarFile, root: Path, rel: str) -> None:
    path = root / rel
    info = tarfile.TarInfo(rel)
    info.mtime = 0
    if path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    info.mode, info.size = 0o644, path.stat().st_size
    with open(path, "rb") as src:
        tar.addfile(info, src)


def read_index(archive: Path) -> dict[str, Any]:
    """The index.json of an OCI archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive}: no index.json")
        index: dict[str, Any] = json.load(member)
        return index


def archive_names(archive: Path) -> list[str]:
    """The image names an OCI archive carries (containerd's annotation)."""
    manifests = read_index(archive)["manifests"]
    return [m.get("annotations", {}).get(NAME_ANNOTATION, "") for m in manifests]


def remove_tree(path: Path) -> None:
    """rm -rf that first unmounts whatever a killed chroot tool (debootstrap) left mounted below."""
    if not path.exists():
        return
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    shutil.rmtree(path)


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
