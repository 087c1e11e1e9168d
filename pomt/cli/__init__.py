"""The `pomt` console script: typer commands over the library."""

from pomt.cli import (
    bench,  # noqa: F401
    info,  # noqa: F401  (registers commands)
)
from pomt.cli.app import app, main

__all__ = ["app", "main"]
