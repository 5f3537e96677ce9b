"""Loading ``libnvidia-ml.so.1`` for pynvml, and calling it.

pynvml loads the library by soname (``CDLL("libnvidia-ml.so.1")``); to use
another build (our C mock) either set ``LD_LIBRARY_PATH`` before the process
starts, or set ``PATCHBAY_NVML_LIBRARY`` to the library's absolute path, or
pass ``driver_root`` (the plugin's ``--driver-root``; the library is looked up
below it, ``driver.nvml.library``, on every ``init`` until it is loaded, so a
driver installed later is picked up): we load that file first, and the
dynamic loader then resolves pynvml's soname lookup to the already loaded
object. The environment variable (a test hook) wins.

Every pynvml call of :mod:`driver.nvml.pynvml_backend` and
:mod:`driver.nvml.pynvml_events` goes through :func:`call`, which turns
pynvml's errors into ours.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml.backend import NvmlReturn, nvml_error
from driver.nvml.library import find_library

log = logging.getLogger(__name__)

LIBRARY_ENV = "PATCHBAY_NVML_LIBRARY"
_preloaded: list[ctypes.CDLL] = []


def preload_library(driver_root: Path | None = None) -> None:
    """Load the library by absolute path once it is there (looked up again on
    every call until then: a driver installed later is found)."""
    if _preloaded:
        return
    found = find_library(driver_root) if driver_root is not None else None
    path = os.environ.get(LIBRARY_ENV) or (str(found) if found else "")
    if not path:
        return  # pynvml tries the soname through the dynamic loader
    try:
        _preloaded.append(ctypes.CDLL(str(Path(path).resolve())))
    except OSError as exc:
        raise nvml_error(NvmlReturn.LIBRARY_NOT_FOUND, f"cannot load {path}: {exc}") from exc
    log.info("NVML library preloaded from %s", path)


def call(fn: Callable[..., Any], *args: Any, device: bool = False) -> Any:
    """Run a pynvml function, turning NVMLError into our NvmlError."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise nvml_error(int(exc.value), str(exc), device=device) from exc


def code_of(exc: NvmlError) -> NvmlReturn | None:
    try:
        return NvmlReturn(exc.code)
    except ValueError:
        return None
