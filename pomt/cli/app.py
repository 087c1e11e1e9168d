"""The typer application and the one place where errors become one line: exit code 2 for bad input, 130 for
Ctrl-C."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from typer.exceptions import TyperException

from pomt.errors import Interrupted, PomtError

app = typer.Typer(name="pomt", help="Hardware-aware token pruning schedules for Vision Transformers.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def fail(message: str) -> None:
    """Print one error line and exit with the bad-input code."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


@contextmanager
def interrupted_means(message: str) -> Iterator[None]:
    """Ctrl-C inside a command that keeps no journal: `message` says what became of its work."""
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(message) from None


def main(argv: list[str] | None = None) -> None:
    """Console entry point: pomt and usage errors become one line on stderr (exit 2), Ctrl-C one line (exit 130).
    The command runs through click's context, not typer's main, which turns Ctrl-C into a return value an
    embedding caller would take for success."""
    warnings.showwarning = _one_line_warning
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        with command.make_context(_program_name(), args) as ctx:
            command.invoke(ctx)
    except PomtError as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except TyperException as exc:  # click's usage errors, vendored by typer
        if type(exc).__name__ == "NoArgsIsHelpError":  # typer has printed the help already
            raise SystemExit(EXIT_BAD_INPUT) from None
        fail(f"{exc.format_message()} (see --help)")
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, Interrupted) else "interrupted; nothing to resume", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


def _program_name() -> str:
    """What the usage line calls the program: `python -m pomt`, or the script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name not in ("__main__", ""):
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "pomt"
