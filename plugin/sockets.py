"""Where the plugin's two Unix sockets live, and their lifecycle on disk.

The kubelet's plugin watcher looks for registration sockets in its registry
directory; the DRA socket goes in our own plugin directory and is advertised
through ``GetInfo``. For rolling updates (kubelet 1.33+) both names carry the
pod UID so an old and a new plugin pod can serve side by side; they then share
the plugin directory, where the prepare lock file lives.

A socket file left by a previous instance is removed before binding (only if
it is a socket: a regular file or directory in its place is a configuration
mistake we refuse to delete). Unix socket paths are limited by
``sun_path`` to 107 bytes, which deep test directories exceed easily, so the
length is checked up front with a clear error instead of a bind failure.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from driver import DRIVER_NAME
from driver.errors import ConfigError, SocketPathError

log = logging.getLogger(__name__)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_ROOT = Path("/var/lib/kubelet/plugins")
MAX_SOCKET_PATH_BYTES = 107
LOCK_FILE_NAME = "prepare.lock"
CHECKPOINT_FILE_NAME = "checkpoint.json"

_POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")


@dataclass(frozen=True)
class SocketPaths:
    """The registration socket, the DRA socket and the plugin directory."""

    registration: Path
    dra: Path
    plugin_dir: Path

    @property
    def lock_file(self) -> Path:
        """The file both plugin pods lock around prepare/unprepare."""
        return self.plugin_dir / LOCK_FILE_NAME


def checkpoint_file(plugin_dir: Path) -> Path:
    """The checkpoint of prepared claims, in the plugin directory that both
    plugin pods of a rolling update share (``driver.checkpoint``)."""
    return Path(plugin_dir) / CHECKPOINT_FILE_NAME


def socket_paths(
    registry_dir: Path = DEFAULT_REGISTRY_DIR,
    plugin_dir: Path | None = None,
    pod_uid: str | None = None,
    driver_name: str = DRIVER_NAME,
) -> SocketPaths:
    """Compute (not create) the socket paths.

    ``plugin_dir`` defaults to ``/var/lib/kubelet/plugins/<driver>``. With
    ``pod_uid`` (rolling update) the names become ``<driver>-<uid>-reg.sock``
    and ``dra-<uid>.sock``. Directories are made absolute, because the DRA
    path is advertised to the kubelet as is.
    """
    if plugin_dir is None:
        plugin_dir = DEFAULT_PLUGINS_ROOT / driver_name
    registry_dir, plugin_dir = Path(registry_dir).absolute(), Path(plugin_dir).absolute()
    if pod_uid:
        if not _POD_UID.fullmatch(pod_uid):
            raise ConfigError(f"pod UID {pod_uid!r} is not usable in a socket file name")
        reg_name, dra_name = f"{driver_name}-{pod_uid}-reg.sock", f"dra-{pod_uid}.sock"
    else:
        reg_name, dra_name = f"{driver_name}-reg.sock", "dra.sock"
    paths = SocketPaths(registry_dir / reg_name, plugin_dir / dra_name, plugin_dir)
    check_length(paths.registration)
    check_length(paths.dra)
    return paths


def check_length(path: Path) -> None:
    """Refuse a path that does not fit in ``sockaddr_un.sun_path``."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise SocketPathError(
            f"socket path {path} is {size} bytes; Unix sockets allow at most "
            f"{MAX_SOCKET_PATH_BYTES}: choose a shorter directory"
        )


def prepare_for_bind(path: Path) -> None:
    """Create the parent directory and remove a stale socket at ``path``."""
    check_length(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(
            f"{path} exists and is not a socket; refusing to replace it (remove it by hand "
            "if it is really ours)"
        )
    log.info("removing stale socket %s", path)
    path.unlink(missing_ok=True)


def remove_socket(path: Path) -> None:
    """Remove our socket on shutdown; anything else at that path is left alone."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
            log.debug("removed socket %s", path)
    except FileNotFoundError:
        pass
