"""The OCI archives tests/harness/images.py writes: what `ctr images import` needs to find in them.

An archive is a tar of an OCI layout: `oci-layout`, `index.json` naming each
image (io.containerd.image.name, a full reference), and content-addressed
blobs whose digests and sizes match the descriptors pointing at them. No
network, no buildah: only the stdlib writer.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from tests.harness import image_oci as oci
from tests.harness import image_tools, images


def _build(tmp_path: Path, names: tuple[str, ...]) -> Path:
    tmp_path.mkdir(exist_ok=True)
    with oci.LayerTar(tmp_path / "layer.tar") as layer:
        layer.dir("bin")
        layer.dir("tmp", 0o1777)
        layer.file("bin/hello", b"#!/bin/sh\necho hi\n", 0o755)
        layer.symlink("bin/sh", "/bin/busybox")
    layout = oci.Layout(tmp_path / "layout")
    layout.image([layout.layer(tmp_path / "layer.tar")], {"Cmd": ["sh"]}, names)
    layout.write_index()
    oci.pack(layout.root, tmp_path / "image.oci.tar")
    return tmp_path / "image.oci.tar"


def _blobs(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        out = {}
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None:
                out[member.name] = f.read()
        return out


def _blob(files: dict[str, bytes], desc: dict[str, Any]) -> bytes:
    algo, digest = desc["digest"].split(":")
    data = files[f"blobs/{algo}/{digest}"]
    assert hashlib.sha256(data).hexdigest() == digest
    assert len(data) == desc["size"]
    return data


def test_archive_is_a_valid_named_oci_layout(tmp_path: Path) -> None:
    archive = _build(tmp_path, ("registry.k8s.io/pause:3.10", "patchbay:0.1.0"))
    files = _blobs(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    assert index["mediaType"] == oci.MEDIA_INDEX
    assert oci.archive_names(archive) == [
        "registry.k8s.io/pause:3.10",
        "docker.io/library/patchbay:0.1.0",  # as the CRI looks `patchbay:0.1.0` up
    ]
    for desc in index["manifests"]:
        assert desc["annotations"][oci.REF_ANNOTATION] == desc["annotations"][oci.NAME_ANNOTATION]
        assert desc["platform"] == {"architecture": oci.go_arch(), "os": "linux"}
        manifest = json.loads(_blob(files, desc))
        assert manifest["mediaType"] == desc["mediaType"] == oci.MEDIA_MANIFEST
        config = json.loads(_blob(files, manifest["config"]))
        assert config["os"] == "linux" and config["config"] == {"Cmd": ["sh"]}
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == oci.MEDIA_LAYER
        raw = gzip.decompress(_blob(files, layer))
        assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(raw).hexdigest()}"]
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            entries = {m.name: m for m in tar.getmembers()}
        assert entries["tmp"].mode == 0o1777 and entries["bin/hello"].mode == 0o755
        assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "/bin/busybox"
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in entries.values())


def test_same_inputs_give_the_same_archive(tmp_path: Path) -> None:
    first = _build(tmp_path / "a", ("x.example/a:1",)).read_bytes()
    assert _build(tmp_path / "b", ("x.example/a:1",)).read_bytes() == first


def test_buildah_layout_is_renamed_for_containerd(tmp_path: Path) -> None:
    manifest = {"mediaType": oci.MEDIA_MANIFEST, "digest": "sha256:" + "0" * 64, "size": 1}
    pushed = {**manifest, "annotations": {oci.REF_ANNOTATION: "0.1.0"}}
    (tmp_path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [pushed]}))
    oci.rename_layout(tmp_path, ("patchbay:0.1.0",))
    (desc,) = json.loads((tmp_path / "index.json").read_text())["manifests"]
    assert desc["annotations"] == {
        oci.NAME_ANNOTATION: "docker.io/library/patchbay:0.1.0",
        oci.REF_ANNOTATION: "docker.io/library/patchbay:0.1.0",
    }
    assert desc["digest"] == manifest["digest"]


def test_short_names_are_normalised_like_the_cri() -> None:
    assert oci.containerd_name("busybox:1.35") == "docker.io/library/busybox:1.35"
    assert oci.containerd_name("team/app:1") == "docker.io/team/app:1"
    assert oci.containerd_name("patchbay.dev/busybox:1.35") == "patchbay.dev/busybox:1.35"
    assert oci.containerd_name("localhost/base:x") == "localhost/base:x"
    assert oci.containerd_name("host:5000/app:1") == "host:5000/app:1"


def test_base_layer_drops_host_files_and_docs_but_keeps_copyrights() -> None:
    def keep(name: str, kind: bytes = tarfile.REGTYPE) -> bool:
        info = tarfile.TarInfo(name)
        info.type = kind
        return image_tools.keep_in_base(info)

    assert not keep("etc/resolv.conf") and not keep("etc/hostname") and not keep("dev/null")
    assert not keep("var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease")
    assert keep("var/lib/apt/lists/partial", tarfile.DIRTYPE)
    assert not keep("usr/share/man/man1/ls.1.gz") and keep("usr/share/man", tarfile.DIRTYPE)
    assert keep("usr/share/doc/libc6/copyright") and not keep("usr/share/doc/libc6/changelog.gz")
    assert keep("usr/bin/python3.11") and keep("usr/lib/x86_64-linux-gnu/libudev.so.1")


def test_archive_names_follow_their_inputs(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("K8S_CACHE_ROOT", str(tmp_path))
    src = tmp_path / "pause.c"
    src.write_text("int main(void) { return 0; }\n")
    monkeypatch.setattr(images, "PAUSE_SRC", src)
    before = images.archive_path("pause")
    assert before.parent == tmp_path / "images"
    assert images.archive_path("pause") == before
    src.write_text("int main(void) { return 1; }\n")
    assert images.archive_path("pause") != before
    assert images.archive_path("patchbay").name.startswith(f"patchbay-{images.VERSION}-")


def test_renaming_an_image_gives_a_new_archive(monkeypatch: Any) -> None:
    before = images.archive_path("pause")
    renamed = dataclasses.replace(images.SPECS["pause"], names=("registry.k8s.io/pause:9.9",))
    monkeypatch.setitem(images.SPECS, "pause", renamed)
    assert images.archive_path("pause") != before
