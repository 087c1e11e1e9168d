"""A typer command's options read from configuration dataclasses (see `pomt.options`)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from pomt.options import PANELS, flag

_CLI_TYPES = (bool, int, float, Path, str)  # first match wins for a union such as `int | tuple[int, int]`


def config_command(*configs: type) -> Callable[[Callable], Callable]:
    """Decorate a command taking one instance of each dataclass in `configs`: typer sees one option per field, and
    the command receives the dataclasses built from the parsed options."""

    def decorate(command: Callable) -> Callable:
        fields = [(typing.get_type_hints(cls), f) for cls in configs for f in dataclasses.fields(cls)]
        fields.sort(key=lambda pair: _panel_rank(pair[1]))  # --help lists panels in order
        parameters = [_parameter(f, hints[f.name]) for hints, f in fields]

        def run(**values: Any) -> Any:
            plain = {name: value.value if isinstance(value, enum.Enum) else value for name, value in values.items()}
            built = [cls(**{f.name: plain[f.name] for f in dataclasses.fields(cls)}) for cls in configs]
            return command(*built)

        run.__signature__ = inspect.Signature(parameters)
        run.__name__, run.__doc__ = command.__name__, command.__doc__
        return run

    return decorate


def _panel_rank(f: dataclasses.Field) -> int:
    """Where a field's help panel comes in `PANELS` (no panel: first, in typer's own panel)."""
    panel = f.metadata.get("panel")
    return -1 if panel is None else PANELS.index(panel)


def _parameter(f: dataclasses.Field, hint: Any) -> inspect.Parameter:
    meta = f.metadata
    if "help" not in meta:
        raise TypeError(f"config field {f.name!r} is not declared with pomt.options.option()")
    name = flag(f)
    annotation = _cli_type(f.name, hint)
    if meta["choices"]:
        annotation = enum.Enum(f.name.title().replace("_", ""), {c: c for c in meta["choices"]}, type=str)
    info = typer.Option(f.default, f"{name}/--no-{name[2:]}" if meta["negatable"] else name, help=meta["help"],
                        min=meta["min"], max=meta["max"], show_default=f.default is not None,
                        rich_help_panel=meta.get("panel"))
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


def _cli_type(name: str, hint: Any) -> type:
    """The type the CLI parses for a field: the field's type, or the first CLI type of a union."""
    members = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    for candidate in _CLI_TYPES:
        if candidate in members:
            return candidate
    raise TypeError(f"config field {name!r} has type {hint}, which has no command-line form")
