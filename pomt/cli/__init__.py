"""The `pomt` console script: typer commands over the library."""

from pomt.cli import (  # noqa: F401  (importing a command module registers its commands)
    commands,
    offline,
)
from pomt.cli.app import app, main

__all__ = ["app", "main"]
