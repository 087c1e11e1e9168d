"""The typer application and the one place where errors become one line and exit code 2."""

from __future__ import annotations

import sys
import warnings

import typer
from typer.exceptions import TyperException

from pomt.errors import PomtError

app = typer.Typer(
    name="pomt",
    help="Hardware-aware token pruning schedules for Vision Transformers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

EXIT_BAD_INPUT = 2


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def fail(message: str) -> None:
    """Print one error line and exit with the bad-input code."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning pomt and usage errors into one line on stderr."""
    warnings.showwarning = _one_line_warning
    try:
        app(args=argv, standalone_mode=False)
    except PomtError as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except TyperException as exc:  # click's usage errors, vendored by typer
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help(), file=sys.stderr)
            raise SystemExit(EXIT_BAD_INPUT) from None
        fail(f"{exc.format_message()} (see --help)")
    except KeyboardInterrupt:
        print("interrupted: partial results are kept; rerun with --resume to continue", file=sys.stderr)
        raise SystemExit(130) from None
