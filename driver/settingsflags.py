"""One name per setting across CLI flag, environment variable and Helm value.

A process declares its settings as a pydantic model. Field ``cdi_root``
becomes flag ``--cdi-root`` and env var ``CDI_ROOT`` (the Helm value is
``cdiRoot`` under the component's section). Precedence: flag, then env var,
then the default. Validation errors name the setting in all its spellings,
model-level ones (a check across settings) too: the field names in their
message are rewritten into the settings' flag and env spellings.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from driver.errors import ConfigError

S = TypeVar("S", bound=BaseModel)


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return field.upper()


def helm_name(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(p.capitalize() for p in rest)


def parse_settings(
    model: type[S],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prog: str | None = None,
) -> S:
    """Build ``model`` from flags and environment variables."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=prog, description=model.__doc__)
    for name, info in model.model_fields.items():
        default = "" if info.is_required() else f" (default: {info.default!r})"
        parser.add_argument(
            flag_name(name),
            dest=name,
            default=None,
            help=f"{info.description or ''} [env {env_name(name)}]{default}",
        )
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for name in model.model_fields:
        flag_value = getattr(args, name)
        if flag_value is not None:
            values[name] = flag_value
        elif env_name(name) in environ:
            values[name] = environ[env_name(name)]
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = [_problem(model, err["loc"], err["msg"]) for err in exc.errors()]
        raise ConfigError("invalid settings: " + "; ".join(problems)) from exc


def spellings(field: str) -> str:
    """How a user writes the setting ``field``: ``--cdi-root / CDI_ROOT``."""
    return f"{flag_name(field)} / {env_name(field)}"


def _problem(model: type[BaseModel], loc: tuple[int | str, ...], msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    if loc:
        return f"{spellings(str(loc[0]))}: {msg}"
    # A model-level check: no location, but its message names the fields.
    names = sorted(model.model_fields, key=len, reverse=True)
    if not names:
        return msg
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda m: spellings(m.group(1)), msg)
