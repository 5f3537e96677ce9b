"""Two processes that prefer one port block get two (tests/harness/ports.py).

Two runs on one machine both have an xdist worker gw0: without holding the
block both took block 0 and the same ports (a controller's metrics port was
already bound).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from tests.harness.ports import BLOCKS, claim_block

REPO = Path(__file__).resolve().parents[2]
HOLDER = """
import sys
from tests.harness.ports import claim_block
block, holder = claim_block(int(sys.argv[1]), sys.argv[2])
print(block, holder is not None, flush=True)
sys.stdin.read()  # hold the block until told to end
"""


def test_a_block_another_process_holds_is_not_taken() -> None:
    name = f"pb-test-{uuid.uuid4().hex}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "3", name], cwd=REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().split() == ["3", "True"]
        block, mine = claim_block(3, name)
        assert mine is not None and block == 4
        mine.close()
    finally:
        holder.communicate("")
    again, mine = claim_block(3, name)  # the holder ended: its block is free again
    assert again == 3 and mine is not None
    mine.close()


def test_the_last_block_wraps_to_the_first() -> None:
    name = f"pb-test-{uuid.uuid4().hex}"
    last, held = claim_block(BLOCKS - 1, name)
    assert last == BLOCKS - 1 and held is not None
    first, other = claim_block(BLOCKS - 1, name)
    assert first == 0 and other is not None
    held.close()
    other.close()
