"""The warm-spare policy's settings (docs/fabric.md, "Warm spares").

Why: one place for the six values, mixed into ``ControllerSettings`` so
each is one setting: flag ``--spares-fixed``, env ``SPARES_FIXED``, Helm
``controller.sparesFixed`` (and so on). The count lists are checked here,
at the trust boundary, with an error naming the setting and the entry.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from driver.controller.spares.policy import SpareRules, parse_counts


class SpareSettings(BaseModel):
    spares_fixed: str = Field(
        default="",
        description="warm spares kept attached on every fabric node, as kind:model=N entries "
        "separated by ',' (kind: gpu, nic, nvme, cxlmem; model: the device's productName); "
        "empty: none",
    )
    spares_demand: str = Field(
        default="",
        description="warm spares kept on a node after an allocation there of that kind and "
        "model, for spares_demand_window seconds, as kind:model=N (kind:*=N: any model)",
    )
    spares_demand_window: float = Field(
        default=600.0, gt=0, description="seconds after an allocation on a node that its "
        "demand-driven spares are wanted",
    )  # fmt: skip
    spares_cap: float = Field(
        default=0.25, ge=0, le=1, description="the most spares, as a share of the fabric "
        "pool's devices (rounded down)",
    )  # fmt: skip
    spares_idle_timeout: float = Field(
        default=300.0, gt=0, description="seconds a spare above the fixed count stays attached "
        "when no pod takes it (then detached, and its node's demand window closed)",
    )  # fmt: skip

    spares_replace_failed: bool = Field(
        default=False, description="attach a warm spare GPU to a node for each GPU it lost "
        "(a local one its plugin gave up on or cannot cure, a fabric one that failed there), "
        "within spares_cap",
    )  # fmt: skip

    @field_validator("spares_fixed")
    @classmethod
    def _fixed(cls, value: str) -> str:
        parse_counts(value, "spares_fixed")
        return value

    @field_validator("spares_demand")
    @classmethod
    def _demand(cls, value: str) -> str:
        parse_counts(value, "spares_demand", wildcard=True)
        return value

    def spare_rules(self) -> SpareRules:
        return SpareRules(
            parse_counts(self.spares_fixed, "spares_fixed"),
            parse_counts(self.spares_demand, "spares_demand", wildcard=True),
            self.spares_demand_window,
            self.spares_cap,
            self.spares_idle_timeout,
            self.spares_replace_failed,
        )
