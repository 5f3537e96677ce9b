"""Process logging: text for people, JSON for log pipelines.

Levels are names (``debug``, ``info``, ``warning``, ``error``), never numeric
verbosity. Every module logs through ``logging.getLogger(__name__)`` with
%-style arguments; this module decides the output format and carries the
context of a line: the ``claim``, ``pod``, ``node`` and ``device`` it is
about (:data:`CONTEXT_FIELDS`) become fields of its JSON object (and
``key=value`` words after a text line).

Context comes from three places, later ones winning: fields of the whole
process (:func:`set_process_fields`, e.g. the plugin's node), a context
variable set per operation (:func:`log_context` around a block, or
:func:`bind_log_context` for the rest of an asyncio task: every task runs
in a copy of its creator's context, and ``asyncio.to_thread`` carries it
into the worker thread), and a call's ``extra={"claim": ...}``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
import types
from collections.abc import Iterator, Mapping
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
CONTEXT_FIELDS = ("claim", "pod", "node", "device")

_PROCESS: dict[str, str] = {}
_NONE: Mapping[str, str] = types.MappingProxyType({})
_CONTEXT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "patchbay_log_context", default=_NONE
)
# What every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}  # fmt: skip


def _clean(fields: Mapping[str, object]) -> dict[str, str]:
    return {k: str(v) for k, v in fields.items() if v is not None and v != ""}


def set_process_fields(**fields: object) -> None:
    """Fields every line of this process carries (e.g. ``node=``)."""
    _PROCESS.update(_clean(fields))


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Lines logged inside the block (and in tasks/threads it starts) carry ``fields``."""
    token = _CONTEXT.set({**_CONTEXT.get(), **_clean(fields)})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def bind_log_context(**fields: object) -> None:
    """Add ``fields`` to the current context for good: for a task of its own
    (an attach worker), whose context no other task shares."""
    _CONTEXT.set({**_CONTEXT.get(), **_clean(fields)})


def context_of(record: logging.LogRecord, process: bool = True) -> dict[str, Any]:
    """The context fields of ``record``: process (unless not wanted), context
    variable, ``extra``."""
    out: dict[str, Any] = {**(_PROCESS if process else {}), **_CONTEXT.get()}
    attrs = vars(record)
    for key in attrs.keys() - _STANDARD:
        value = attrs[key]
        if not key.startswith("_"):
            ok = value is None or isinstance(value, str | int | float | bool)
            out[key] = value if ok else str(value)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in context_of(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    """The usual text line, with the context fields as ``key=value`` words
    (not the process's: a person reads one process's log at a time)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = context_of(record, process=False)
        words = [f"{k}={fields.pop(k)}" for k in CONTEXT_FIELDS if k in fields]
        words += [f"{k}={v}" for k, v in sorted(fields.items())]
        return f"{line} [{' '.join(words)}]" if words else line


def configure(level: str = "info", fmt: str = "text") -> None:
    # No formatter here writes the process id or name: without these, a
    # record costs no getpid syscall (the plugin logs two per claim pair).
    logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
