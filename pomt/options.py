"""Command-line options declared on the fields of a configuration dataclass.

A field made with `option()` is the one source of its flag (`--` + the field name with "-" for "_"), its
default and its help text; `pomt.cli.options.config_command` turns such a dataclass into the parameters of
a typer command. Adding a field is all it takes to add a flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Any


def option(
    default: Any,
    help: str,
    *,
    choices: Sequence[str] | None = None,
    negatable: bool = False,
    min: float | None = None,
) -> Any:
    """A dataclass field that is also a CLI option.

    `choices`: the values allowed (the CLI lists them and refuses others); `negatable`: a boolean flag with
    a `--no-` form; `min`: the smallest value the CLI accepts.
    """
    metadata = {"help": help, "choices": tuple(choices) if choices else None, "negatable": negatable, "min": min}
    return field(default=default, metadata=metadata)
