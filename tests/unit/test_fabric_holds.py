"""The words that say a device is held (``driver.fabric_devices.holds``) read
back as written, also inside the scheduler's quoting of the claim's condition."""

from __future__ import annotations

from driver.fabric_devices.holds import held_for, hold_in


def test_the_hold_words_read_back_as_written() -> None:
    for seconds in (600.0, 0.5, 1e6):
        assert hold_in("the attach failed; " + held_for("gpu-1", seconds)) == ("gpu-1", seconds)
    said = held_for("fab-slot.3", 45)
    quoted = f'device binding failed: claim=c, reason=AttachFailed, message="boom; {said}"'
    assert hold_in(quoted) == ("fab-slot.3", 45.0)
    assert (
        hold_in("a fabric resource is broken; the device is not held (it is not at fault)") is None
    )
