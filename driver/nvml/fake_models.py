"""GPU model facts for the in-memory NVML fake.

The same figures as the C mock's ``hack/nvml-mock/models.c`` (and
ARCHITECTURE.md section 6); the contract suite compares what both report, so
a difference here fails a test rather than drifting silently. The H200's
figures are what a real H200 reported (hack/nvml-mock/README.md, "Checked
against a real GPU").
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.nvml.backend import MigProfile


@dataclass(frozen=True)
class ModelFacts:
    key: str
    product_name: str
    architecture: str
    cuda_compute_capability: str
    memory_mib: int
    brand: str
    mig_capable: bool
    mig_needs_reset: bool  # Ampere: a MIG mode change waits for a GPU reset
    profiles: tuple[MigProfile, ...]


# (profile id, compute slices, memory slots, max count, starts, media engines)
_PLACEMENT = {
    "1g": (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), False),
    "1g+me": (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), True),
    "1g2x": (15, 1, 2, 4, (0, 2, 4, 6), False),
    "2g": (14, 2, 2, 3, (0, 2, 4), False),
    "3g": (9, 3, 4, 2, (0, 4), False),
    "4g": (5, 4, 4, 1, (0,), False),
    "7g": (0, 7, 8, 1, (0,), True),
}
_AMPERE_SMS = {"1g": 14, "1g+me": 14, "1g2x": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_HOPPER_SMS = {"1g": 16, "1g+me": 16, "1g2x": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}


def _profiles(
    names: dict[str, str], memory: dict[str, int], sms: dict[str, int]
) -> tuple[MigProfile, ...]:
    out = []
    for kind, (pid, slices, slots, max_count, starts, media) in _PLACEMENT.items():
        out.append(
            MigProfile(
                profile_id=pid,
                name=names[kind],
                compute_slices=slices,
                memory_slots=slots,
                memory_mib=memory[kind],
                multiprocessors=sms[kind],
                media_engines=media,
                placements=tuple((s, slots) for s in starts),
                max_count=max_count,
            )
        )
    return tuple(sorted(out, key=lambda p: (p.memory_slots, p.compute_slices, p.media_engines)))


def _names(one: str, two: str, four: str, eight: str) -> dict[str, str]:
    return {
        "1g": f"1g.{one}",
        "1g+me": f"1g.{one}+me",
        "1g2x": f"1g.{two}",
        "2g": f"2g.{two}",
        "3g": f"3g.{four}",
        "4g": f"4g.{four}",
        "7g": f"7g.{eight}",
    }


def _memory(one: int, two: int, four: int, eight: int) -> dict[str, int]:
    return {"1g": one, "1g+me": one, "1g2x": two, "2g": two, "3g": four, "4g": four, "7g": eight}


MODELS = {
    m.key: m
    for m in (
        ModelFacts(
            "A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB",
            "ampere",
            "8.0",
            40960,
            "Nvidia",
            True,
            True,
            _profiles(
                _names("5gb", "10gb", "20gb", "40gb"),
                _memory(4864, 9856, 19968, 40192),
                _AMPERE_SMS,
            ),
        ),
        ModelFacts(
            "A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            "ampere",
            "8.0",
            81920,
            "Nvidia",
            True,
            True,
            _profiles(
                _names("10gb", "20gb", "40gb", "80gb"),
                _memory(9856, 19968, 40192, 80384),
                _AMPERE_SMS,
            ),
        ),
        ModelFacts(
            "H100-SXM5-80GB",
            "NVIDIA H100 80GB HBM3",
            "hopper",
            "9.0",
            81559,
            "Nvidia",
            True,
            False,
            _profiles(
                _names("10gb", "20gb", "40gb", "80gb"),
                _memory(9984, 20096, 40448, 81152),
                _HOPPER_SMS,
            ),
        ),
        ModelFacts(
            "H200-SXM5-141GB",
            "NVIDIA H200",
            "hopper",
            "9.0",
            143771,
            "Nvidia",
            True,
            False,
            _profiles(
                _names("18gb", "35gb", "71gb", "141gb"),
                _memory(16384, 33280, 71424, 143360),
                _HOPPER_SMS,
            ),
        ),
        ModelFacts("L40S", "NVIDIA L40S", "ada", "8.9", 46068, "Nvidia", False, False, ()),
    )
}
