"""The hypothesis profile and JSON strategies shared by the fuzz tests.

Why it exists: every fuzz module must be reproducible in CI and bounded in
time, so they share one settings object (derandomized, no example database,
a fixed number of examples) rather than each choosing its own. There is no
deadline: a per-example time limit is a timing assertion, and a loaded CI
machine would fail it for no fault of the code; ``max_examples`` bounds the
time instead (each fuzz module runs in a few seconds). The sysfs fuzz tests
share the odd attribute-file contents they write and the way they put a
tree's files back after each example.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value (what a decoded body may hold)."""
    return st.recursive(
        SCALARS,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=max_leaves,
    )


def mutated(template: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``template`` with some keys dropped, some values replaced by any JSON
    value, and some unknown keys added: near-valid bodies, where bugs hide."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in template.items():
            choice = draw(st.integers(min_value=0, max_value=9))
            if choice == 0:
                continue  # dropped
            if choice == 1:
                out[key] = draw(json_values(4))
            elif isinstance(value, dict) and choice < 5:
                out[key] = draw(mutated(value))
            elif isinstance(value, list) and value and isinstance(value[0], dict) and choice < 5:
                out[key] = [draw(mutated(value[0]))]
            else:
                out[key] = value
        out.update(draw(st.dictionaries(st.text(max_size=6), json_values(2), max_size=1)))
        return out

    return build()


# Odd contents of a sysfs attribute file; None: a directory where the file was.
CONTENTS = st.one_of(
    st.binary(max_size=12),
    st.sampled_from(["", "\n", "-1", "0x", "0x02000", " 8 \n", "²", "٣", "1e3", "9" * 30]).map(
        str.encode
    ),
    st.text(max_size=8).map(str.encode),
    st.none(),  # a directory where the file was
)


class Files:
    """Replace files of a tree for one example and put them back after."""

    def __init__(self) -> None:
        self.saved: list[tuple[Path, bytes | None]] = []

    def put(self, path: Path, content: bytes | None) -> None:
        self.saved.append((path, path.read_bytes() if path.exists() else None))
        path.unlink(missing_ok=True)
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)

    def restore(self) -> None:
        for path, content in reversed(self.saved):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            if content is not None:
                path.write_bytes(content)
