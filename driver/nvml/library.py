"""Where the NVML library lives: below the driver root, like NVIDIA's ``nvidiaDriverRoot``.

Why this module exists: on GPU nodes the NVIDIA driver is often installed
in a directory that is not the container's root (a driver container mounts
it at ``/run/nvidia/driver``, a host install is ``/``), and the plugin image
carries no driver. The plugin's ``--driver-root`` names that directory (the
chart mounts it); this module finds ``libnvidia-ml.so.1`` below it in the
usual library directories, so the plugin loads the host's library by
absolute path instead of trusting the image's loader path. The lookup is
repeated on every NVML initialisation until the library is loaded, so a
driver installed after the plugin started is found without a restart
(docs/design.md "Hostile hosts").
"""

from __future__ import annotations

from pathlib import Path

LIBRARY_NAME = "libnvidia-ml.so.1"
# Searched in this order below the driver root (Debian/Ubuntu multiarch first).
LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
    "lib",
)


def find_library(driver_root: Path) -> Path | None:
    """The NVML library below ``driver_root``; None when it has none.

    With the driver root ``/`` and no file found, the caller falls back to the
    dynamic loader's own search (``LD_LIBRARY_PATH``, ldconfig).
    """
    for d in LIBRARY_DIRS:
        candidate = driver_root / d / LIBRARY_NAME
        if candidate.is_file():
            return candidate
    return None


def not_found_message(driver_root: Path) -> str:
    """Why no library was loaded, naming where it was looked for."""
    return (
        f"{LIBRARY_NAME} not found below the driver root {driver_root} "
        f"({', '.join(LIBRARY_DIRS)}) nor by the dynamic loader: is the NVIDIA driver installed?"
    )
