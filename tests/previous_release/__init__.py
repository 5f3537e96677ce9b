"""Earlier releases, for rollback tests: their reading code frozen here
(``checkpoint.py``), and their whole plugin taken from the repository's
history (:func:`plugin_tree`).

``RELEASE`` is the last release before the checkpoint journal (issue 36):
it reads only the checkpoint file (format 1), so it is what a rollback
from today's build runs into.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

RELEASE = "47729e1"
_REPO = Path(__file__).resolve().parents[2]


def plugin_tree(dest: Path) -> Path:
    """The release's ``plugin`` and ``driver`` packages under ``dest`` (a
    ``PYTHONPATH`` entry), read from the repository's history with ``git
    archive``: nothing of it is kept in the tree. A clone without that
    commit (a shallow one) fails here, naming it."""
    out = subprocess.run(
        ["git", "-C", str(_REPO), "archive", "--format=tar", RELEASE, "plugin", "driver"],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"the previous release's plugin needs commit {RELEASE} in this clone's history "
            f"(git archive: {out.stderr.decode(errors='replace').strip()})"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest
