"""Fuzzed checkpoint files (near-valid: fields dropped, retyped, added; keys
that are not their records' UIDs), then a plugin start on them. The
property: loading never raises (an unparsable file is moved aside), start-up
recovery never raises (the plugin must start to release anything), and every
claim the loaded file holds can be unprepared, or fails with the typed
"written by a newer build" error when this build does not understand it."""

from __future__ import annotations

import asyncio
import copy
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from driver.claims.model import ClaimRef
from tests.fuzzing import FUZZ, mutated
from tests.unit.fuzz_seeds import CHECKPOINT, UID, start

KEYS = st.sampled_from([UID, "not-a-uuid", "5b0f7d7e-2f4c-4a51-9d3e-0c8a6b2e1f41", UID.upper()])


@settings(FUZZ, max_examples=60)  # a plugin start per example
@given(mutated(CHECKPOINT), KEYS, st.booleans())
def test_a_fuzzed_checkpoint_starts_and_every_claim_unprepares(
    data: dict[str, Any], key: str, rename: bool
) -> None:
    data = copy.deepcopy(data)  # the example may share parts with CHECKPOINT: never edit those
    claims = data.get("claims")
    if isinstance(claims, dict) and isinstance(claims.get(UID), dict):
        claims[key] = claims.pop(UID)
        if rename:  # the record's own UID too
            claims[key]["uid"] = key
    with tempfile.TemporaryDirectory() as tmp:
        prep, _ = start(Path(tmp), data)
        asyncio.run(prep.recover())
        loaded = dict(prep.checkpoint.claims)
        results = asyncio.run(prep.unprepare([ClaimRef("ns", "c", k) for k in loaded]))
    for uid, record in loaded.items():
        assert record.uid == uid
        if record.not_understood({"gpu"}) is None:
            assert results[uid] == "", results[uid]
        else:
            assert "written by a newer build" in results[uid]
