"""The MPS settings both processes that touch MPS daemons read.

The node plugin (``patchbay-plugin``) decides what daemon a claim needs;
the MPS supervisor (``patchbay-mps-supervisor``, a DaemonSet of its own in
the chart) runs it. Both must agree on the control binary, the host
directory of the daemons and the driver root the binary is found under,
so those settings are defined once, here, and both settings models inherit
them: flag ``--mps-control`` / env ``MPS_CONTROL`` / Helm
``kubeletPlugin.mpsControl``, and so on (the chart sets the supervisor's
from the same ``kubeletPlugin`` values).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

MPS_CONTROL = "nvidia-cuda-mps-control"


class MpsSettings(BaseModel):
    driver_root: Path = Field(
        default=Path("/"),
        description="root of the NVIDIA driver installation: libnvidia-ml.so.1 is loaded "
        "from below it (usr/lib/x86_64-linux-gnu, usr/lib64, ...), else by soname; "
        "NVIDIA's tools (nvidia-smi, nvidia-cuda-mps-control) are in its usr/bin",
    )
    mps_control: str = Field(
        default="",
        description="MPS control binary: one daemon per MPS claim; "
        "empty: usr/bin/nvidia-cuda-mps-control below --driver-root",
    )
    mps_root: Path = Field(
        default=Path("/run/patchbay/mps"),
        description="host directory of the MPS claims' daemons: per claim its want/ready "
        "files and pipe and log directories (mounted into their containers)",
    )

    def driver_tool(self, name: str, given: str) -> Path:
        """An NVIDIA tool's path: ``given`` (its setting), else below the driver root."""
        return Path(given) if given else self.driver_root / "usr" / "bin" / name

    @property
    def mps_control_path(self) -> Path:
        return self.driver_tool(MPS_CONTROL, self.mps_control)
