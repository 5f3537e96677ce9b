"""Which Kubernetes node a fabric's ComputerSystem is: the setting ``fabric_systems``.

Why a module: a host adapter's node is read from its system's ``HostName``,
but many nodes may share one machine (our simulator) or a manager may not
know host names; the setting maps systems (Id or UUID) to nodes for those.
It is parsed here, once, for the inventory reader (which re-exports it).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class FabricSystemsSetting(BaseModel):
    fabric_systems: str = Field(
        default="",
        description="nodes on the fabric's ComputerSystems as 'node=system,...' (system: its "
        "Id or UUID), for systems whose HostName is not the node name; unset: HostName",
    )

    @field_validator("fabric_systems")
    @classmethod
    def _pairs(cls, value: str) -> str:
        system_nodes(value)
        return value

    def system_nodes(self) -> dict[str, str]:
        return system_nodes(self.fabric_systems)


def system_nodes(text: str) -> dict[str, str]:
    """``node=system,...`` as system -> node (ValueError naming a bad or repeated pair)."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        node, sep, system = (s.strip() for s in pair.partition("="))
        if not sep or not node or not system:
            raise ValueError(f"fabric_systems: {pair!r} is not node=system")
        if system.lower() in out:
            raise ValueError(f"fabric_systems: system {system} given twice")
        out[system.lower()] = node
    return out
