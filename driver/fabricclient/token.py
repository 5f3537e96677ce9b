"""The fabric's bearer token as a setting, shared by the fabric service and
its clients (the controller): given inline or, better, in a file."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, model_validator


class FabricTokenSettings(BaseModel):
    fabric_token: str = Field(default="", description="bearer token of the fabric API")
    fabric_token_file: Path | None = Field(
        default=None, description="file holding the bearer token (wins over --fabric-token)"
    )

    @model_validator(mode="after")
    def _has_token(self) -> Self:
        if not self.fabric_token and self.fabric_token_file is None:
            raise ValueError("set fabric_token or fabric_token_file")
        return self

    def token(self) -> str:
        if self.fabric_token_file is not None:
            return self.fabric_token_file.read_text().strip()
        return self.fabric_token
