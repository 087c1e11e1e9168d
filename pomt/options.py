"""Command-line options declared on the fields of a configuration dataclass: a field made with `option()` is the
one source of its flag (`--` + the field name with "-" for "_"), its default, its help text and its range, so
adding a field is all it takes to add a flag."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import Field, field
from typing import Any

SEED_MAX = 2**32 - 1  # the largest seed every generator pomt seeds (torch, numpy) takes

# The help panels a command's options are listed in, in this order (`option(panel=...)`).
WORKLOAD, MEASUREMENT, CHOICE, VERIFICATION, OUTPUTS, ADVANCED = (
    "Workload", "Measurement", "Accuracy and choice", "Verification", "Outputs", "Advanced")
PANELS = (WORKLOAD, MEASUREMENT, CHOICE, VERIFICATION, OUTPUTS, ADVANCED)


def option(default: Any, help: str, *, choices: Sequence[str] | None = None, negatable: bool = False,
           min: float | None = None, max: float | None = None, panel: str | None = None) -> Any:
    """A dataclass field that is also a CLI option; `min`, `max` inclusive (None: unbounded)."""
    metadata = {"help": help, "choices": tuple(choices) if choices else None, "negatable": negatable, "min": min,
                "max": max, "panel": panel}
    return field(default=default, metadata=metadata)


def flag(f: Field) -> str:
    """The command-line flag of an `option()` field."""
    return "--" + f.name.replace("_", "-")
