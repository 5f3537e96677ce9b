"""Regenerate the committed protobuf/gRPC stubs under ``plugin/proto``.

The stubs are committed so that installing patchbay needs no code generator,
and so that review sees every change to the wire code. This script is the
only way they are produced:

    python hack/protogen.py           # rewrite plugin/proto/*_pb2*.py(i)
    python hack/protogen.py --check   # fail if regenerating would change anything

Both modes also check that the generator is the ``grpcio-tools`` version pinned
in pyproject's ``dev`` extra, and that the runtime floors in pyproject's
``dependencies`` (``grpcio>=``, ``protobuf>=``) are at least the versions the
generated code stamps and refuses to run below.

Protos are compiled with ``-I .`` from the repository root, so the generated
modules import each other as ``plugin.proto.<name>_pb2`` and every file has a
unique name (``plugin/proto/dra_v1.proto``) in the protobuf descriptor pool.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from grpc_tools import protoc

TOP = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("plugin/proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'", re.MULTILINE)
_PROTOBUF_STAMP = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
    r"(\d+),\s*(\d+),\s*(\d+),"
)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _generated(root: Path) -> dict[str, Path]:
    """Generated files below ``root/plugin/proto``, keyed by file name."""
    folder = root / PROTO_DIR
    return {
        p.name: p
        for p in sorted(folder.glob("*"))
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def generate(out: Path) -> None:
    """Compile every ``plugin/proto/*.proto`` into ``out`` (mirroring paths)."""
    protos = sorted(str(p.relative_to(TOP)) for p in (TOP / PROTO_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_DIR}")
    args = [
        "grpc_tools.protoc",
        "-I",
        str(TOP),
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")


def _pyproject() -> dict[str, object]:
    with (TOP / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _floor(requirements: list[str], name: str) -> tuple[int, ...] | None:
    for req in requirements:
        m = re.fullmatch(rf"\s*{re.escape(name)}\s*>=\s*([0-9.]+)\s*(,.*)?", req)
        if m:
            return _version(m.group(1))
    return None


def check_versions(generated: dict[str, Path]) -> list[str]:
    """Problems with the generator pin and the runtime floors, as messages."""
    problems: list[str] = []
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    dev = project["optional-dependencies"]["dev"]
    pin = next((r.split("==")[1] for r in dev if r.startswith("grpcio-tools==")), None)
    installed = importlib.metadata.version("grpcio-tools")
    if pin is None:
        problems.append("pyproject's dev extra must pin grpcio-tools with '=='")
    elif installed != pin:
        problems.append(f"grpcio-tools {installed} is installed but pyproject pins {pin}")

    grpc_needed: tuple[int, ...] = ()
    protobuf_needed: tuple[int, ...] = ()
    for path in generated.values():
        text = path.read_text(encoding="utf-8")
        if m := _GRPC_STAMP.search(text):
            grpc_needed = max(grpc_needed, _version(m.group(1)))
        if m := _PROTOBUF_STAMP.search(text):
            protobuf_needed = max(protobuf_needed, tuple(int(g) for g in m.groups()))
    deps = project["dependencies"]
    for name, needed in (("grpcio", grpc_needed), ("protobuf", protobuf_needed)):
        if not needed:
            continue
        want = ".".join(map(str, needed))
        floor = _floor(deps, name)
        if floor is None or floor < needed:
            have = ".".join(map(str, floor)) if floor else "none"
            problems.append(
                f"pyproject dependencies: the generated stubs need {name}>={want} "
                f"but the floor is {have}; set '{name}>={want}'"
            )
    return problems


def diff(fresh: dict[str, Path], committed: dict[str, Path]) -> list[str]:
    """Names of generated files that are missing, stale or different."""
    out = []
    for name in sorted(fresh.keys() | committed.keys()):
        if name not in committed:
            out.append(f"{PROTO_DIR / name}: missing (run `make proto`)")
        elif name not in fresh:
            out.append(f"{PROTO_DIR / name}: stale, no .proto generates it")
        elif not filecmp.cmp(fresh[name], committed[name], shallow=False):
            out.append(f"{PROTO_DIR / name}: differs from a fresh generation")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing, fail on drift")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="protogen-") as tmp:
        generate(Path(tmp))
        fresh = _generated(Path(tmp))
        problems = check_versions(fresh)
        if opts.check:
            problems += diff(fresh, _generated(TOP))
        else:
            for old in _generated(TOP).values():
                old.unlink()
            for name, path in fresh.items():
                shutil.copyfile(path, TOP / PROTO_DIR / name)
                print(f"wrote {PROTO_DIR / name}")
    for line in problems:
        print(f"protogen: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
