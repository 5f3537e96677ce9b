"""Write tests/fixtures/checkpoint-v1 with the code of the day (run once per format).

Why it exists: the fixture must be what the real plugin writes, not a file
typed by hand. This drives the real claim preparer and handlers on the
simulated node of ``tests.upgrade_node``: a whole GPU with an opaque config,
a MIG partition (the NVML fake creates its instances), a VF rebound to
vfio-pci on the simulated sysfs tree, and a VF whose prepare the plugin did
not finish (killed after the rebind: a ``PrepareStarted`` record). It then
copies the checkpoint and the CDI specs into the fixture directory.

    .venv/bin/python -m tests.make_checkpoint_fixture [DIR]

Never regenerate an existing fixture: a new format gets a new directory
(``checkpoint-v2``) and the old one stays, read by every later build.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

from tests.checkpoint_view import recorded
from tests.upgrade_node import FIXTURE, UpgradeNode, ref


class Killed(BaseException):
    """The plugin dies at a crash point (no rollback, as after SIGKILL)."""


def _die_after_device(name: str) -> None:
    if name == "prepare-device-done":
        raise Killed(name)


async def _prepare(node: UpgradeNode) -> None:
    with node.host.effects_watcher():
        prep = node.preparer()
        results = await prep.prepare([ref("whole-gpu"), ref("mig"), ref("vf")])
        failed = {uid: r.error for uid, r in results.items() if r.error}
        if failed:
            raise SystemExit(f"prepare failed: {failed}")
        with (
            mock.patch("driver.claims.preparer.crash_point", _die_after_device),
            _expect(Killed),
        ):
            await node.preparer().prepare([ref("interrupted-vf")])


class _expect:
    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        if kind is not self.kind:
            raise SystemExit("the interrupted prepare did not stop at its crash point")
        return True


def main(argv: list[str]) -> int:
    target = Path(argv[0]) if argv else FIXTURE
    if (target / "checkpoint.json").exists():
        print(f"{target} exists; a new format gets a new directory", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        node = UpgradeNode(Path(tmp))
        asyncio.run(_prepare(node))
        (target / "cdi").mkdir(parents=True, exist_ok=True)
        data = recorded(node.checkpoint_path)  # the file, its journal replayed
        (target / "checkpoint.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        for spec in sorted(node.cdi_root.glob("*.json")):
            shutil.copyfile(spec, target / "cdi" / spec.name)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
