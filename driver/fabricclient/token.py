"""The fabric's bearer token as a setting, shared by the fabric service and
its clients (the controller): given inline or, better, in a file.

Why a :class:`TokenSource` rather than a string: a token in a file (a
mounted Secret) is rotated by rewriting the file, and neither side may need
a restart for it. Each use stats the file (microseconds) and re-reads it
when its inode, size or mtime changed; the kubelet's atomic symlink swap of
a Secret volume changes the inode.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, model_validator

log = logging.getLogger(__name__)


class TokenSource:
    """The current bearer token: inline, or the file's contents, re-read on change."""

    def __init__(self, inline: str = "", path: Path | None = None) -> None:
        self._inline = inline
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = inline

    def current(self) -> str:
        if self._path is None:
            return self._inline
        st = self._path.stat()
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen != self._seen:
            token = self._path.read_text().strip()
            if self._seen is not None and token != self._token:
                log.info("fabric token file %s changed: using the new token", self._path)
            self._seen, self._token = seen, token
        return self._token


class FabricTokenSettings(BaseModel):
    fabric_token: str = Field(default="", description="bearer token of the fabric API")
    fabric_token_file: Path | None = Field(
        default=None,
        description="file holding the bearer token, re-read when it changes (wins over "
        "--fabric-token)",
    )

    @model_validator(mode="after")
    def _has_token(self) -> Self:
        if not self.fabric_token and self.fabric_token_file is None:
            raise ValueError("set fabric_token or fabric_token_file")
        return self

    def token_source(self) -> TokenSource:
        return TokenSource(self.fabric_token, self.fabric_token_file)
