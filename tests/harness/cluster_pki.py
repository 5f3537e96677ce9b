"""Certificates and kubeconfigs for the local control plane.

Why this module exists: the local cluster runs with real authentication
(client certificates against a cluster CA) and real authorization
(Node,RBAC), so every component and every test identity needs its own key,
certificate and kubeconfig. We use the `openssl` command line (present on
every CI image) instead of a Python crypto package, so the launcher has no
third-party dependency. Keys are ECDSA P-256: fast to generate and accepted
by every Kubernetes component.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CA_NAME = "ca"
DAYS = "3650"


class PkiError(RuntimeError):
    """openssl is missing or refused to do its job."""


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise PkiError(
            "the 'openssl' command is required to create the local cluster's certificates"
        )
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _ec_key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    path.chmod(0o600)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key on disk."""

    cert: Path
    key: Path


class Pki:
    """A cluster CA in `directory`, able to issue serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = KeyPair(directory / f"{CA_NAME}.crt", directory / f"{CA_NAME}.key")

    def init(self) -> None:
        """Create the CA (idempotent: an existing CA is kept)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.ca.cert.exists() and self.ca.key.exists():
            return
        _ec_key(self.ca.key)
        _openssl(
            "req", "-x509", "-new", "-key", str(self.ca.key), "-out", str(self.ca.cert),
            "-days", DAYS, "-subj", "/CN=patchbay-local-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server_sans: tuple[str, ...] = (),
    ) -> KeyPair:
        """Issue `<name>.crt/.key` for a client (default) or a server (with SANs)."""
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        _ec_key(pair.key)
        subject = "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"
        usage = "serverAuth" if server_sans else "clientAuth"
        exts = [
            "-addext", "basicConstraints=critical,CA:FALSE",
            "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
            "-addext", f"extendedKeyUsage={usage}",
        ]  # fmt: skip
        if server_sans:
            exts += ["-addext", "subjectAltName=" + ",".join(server_sans)]
        _openssl(
            "req", "-x509", "-new", "-key", str(pair.key), "-out", str(pair.cert),
            "-CA", str(self.ca.cert), "-CAkey", str(self.ca.key),
            "-days", DAYS, "-subj", subject, *exts,
        )  # fmt: skip
        log.debug("issued %s for %s", pair.cert, subject)
        return pair

    def service_account_keys(self) -> KeyPair:
        """The key pair that signs and verifies service-account tokens."""
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        if not pair.key.exists():
            _ec_key(pair.key)
            _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
        return pair


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client: KeyPair, user: str) -> Path:
    """Write a self-contained kubeconfig (JSON is valid YAML) for one identity."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "patchbay",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": user, "context": {"cluster": "patchbay", "user": user}}],
        "current-context": user,
    }
    path.write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path
