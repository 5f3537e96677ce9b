"""Atomic file replacement: write a temp file, swap it with the target.

After a crash of the process at any point the target holds either its old
content or the new content, never a mix: the swap is atomic and what was
written before it is in the kernel's page cache, which outlives the process.
Nothing here calls ``fsync``: only power loss or a kernel crash loses
unsynced data, both mean a reboot, and everything patchbay writes describes
state a reboot undoes anyway (docs/design.md, "Failure model").

An existing target is exchanged with the temp file (``renameat2`` with
``RENAME_EXCHANGE``) and the temp, now holding the old content, removed: a
plain rename over an existing file makes ext4 start writing the new file's
data back at once (``auto_da_alloc``, a guard for the fsync-less programs
the failure model makes us), which cost 0.3-1.4 ms per checkpoint save on a
busy node against 0.1 ms for the exchange. Where the exchange is not
supported, or the target does not exist yet, it is a plain rename. Leftover
temp files (and the spare of a file rewritten often) are the only possible
debris and are named so they are recognisably ours (``.<name>.tmp-<pid>``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
from collections.abc import Callable
from functools import cache
from pathlib import Path

# A path as the hot path passes it: a str joined once (a Path costs a few
# microseconds to join and to encode at each call), or a Path.
StrPath = str | Path

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM}


@cache
def _renameat2() -> Callable[..., int] | None:
    """libc's ``renameat2``, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _rename2(a: StrPath, b: StrPath, flag: int, expected: set[int]) -> int:
    """``renameat2(a, b, flag)``: 0 when done, else the errno when it is one of
    ``expected`` or an "unsupported" one (-1 for no ``renameat2`` at all)."""
    fn = _renameat2()
    if fn is None:
        return -1
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), flag) == 0:
        return 0
    err = ctypes.get_errno()
    if err in _UNSUPPORTED or err in expected:
        return err
    raise OSError(err, os.strerror(err), str(b))


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False (nothing done) where
    the file system or the C library cannot, or ``b`` does not exist."""
    return _rename2(a, b, RENAME_EXCHANGE, set()) == 0


def _fill(path: StrPath, data: bytes, mode: int, fd: int | None = None) -> None:
    """Write ``data`` into ``path`` from offset 0 (created if missing), cut to
    its length: over an old file in place, never truncated to zero first.
    ``fd``: ``path`` opened already (closed here, as an fd opened here is)."""
    if fd is None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, mode)
        except FileNotFoundError:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, mode)
    try:
        view, offset = memoryview(data), 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))  # only shortens an old file (never to zero: no flush)
    finally:
        os.close(fd)


def create_from_spare(
    path: StrPath, data: bytes, spare: StrPath, mode: int = 0o644, *, fd: int | None = None
) -> None:
    """Create ``path`` with ``data`` atomically by filling the ``spare`` file
    (a temp name in the same directory) and renaming it: no inode is made when
    :func:`retire` left one there. An existing ``path`` is replaced as
    :func:`write_atomic` does. ``fd``: the spare opened already
    (``driver.sparefile``), closed here."""
    _fill(spare, data, mode, fd)
    err = _rename2(spare, path, RENAME_NOREPLACE, {errno.EEXIST})
    if err == errno.EEXIST:
        write_atomic(Path(path), data, mode)  # a re-write: the spare stays for the next one
    elif err != 0:  # no RENAME_NOREPLACE here
        if Path(path).exists():
            write_atomic(Path(path), data, mode)
        else:
            Path(spare).rename(path)


def retire(path: StrPath, spare: StrPath) -> bool:
    """Remove ``path`` (True if it existed), its inode kept as ``spare`` when
    there is none yet (the next :func:`create_from_spare` fills it)."""
    err = _rename2(path, spare, RENAME_NOREPLACE, {errno.EEXIST})
    if err == 0:
        return True
    if err == errno.ENOENT:
        return False
    return remove_file(Path(path))


_pid = os.getpid()
# A name no other process on the node has: the pid alone is not one, as two
# plugin pods each in a PID namespace of their own (a rolling update without
# hostPID) may both run as pid 1 over the same host directories.
_tag = f"{_pid}-{secrets.token_hex(4)}"


def _forked() -> None:
    global _pid, _tag
    _pid = os.getpid()
    _tag = f"{_pid}-{secrets.token_hex(4)}"


os.register_at_fork(after_in_child=_forked)


def own_pid() -> int:
    """This process's id, for the names of its temp files and spares: read
    once (and again in a forked child), as glibc does not cache ``getpid``
    and a prepare + unprepare pair names such a file at every write."""
    return _pid


def own_tag() -> str:
    """This process's name among the node's processes (``<pid>-<random>``),
    for files only it may touch outside the cross-process claim lock (the
    spares a prepare opens ahead, ``driver.sparefile``); made again in a
    forked child."""
    return _tag


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, keep_spare: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically (not synced to disk).

    ``keep_spare`` (a file rewritten often, like the checkpoint): after the
    exchange the temp file, holding the old content, stays as the next
    write's temp, written over in place rather than truncated to zero (which
    ext4 would also flush, ``auto_da_alloc``), so a rewrite creates and
    frees no inode.
    """
    tmp = path.parent / f".{path.name}.tmp-{_pid}"
    _fill(tmp, data, mode)
    try:
        if exchange(tmp, path):
            # The target is new; the temp holds the old content (debris if
            # we die now, removed by the next start; or the next spare).
            if not keep_spare:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            return
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def remove_file(path: Path) -> bool:
    """Remove ``path`` if present; True if it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def remove_stale_temps(directory: Path, prefix: str = "") -> int:
    """Remove temp files (and spares) of ours, ``.<prefix>*.tmp-<pid>``: left
    by a crash in the middle of :func:`write_atomic`, or by another process."""
    count = 0
    if directory.is_dir():
        for leftover in directory.glob(f".{prefix}*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                count += 1
    return count
