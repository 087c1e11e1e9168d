"""CLI options read from configuration dataclasses: one field, one flag (pomt.options, pomt.cli.options)."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from pomt.bench.config import BenchConfig
from pomt.cli import app
from pomt.cli.commands import Outputs
from pomt.cli.options import config_command
from pomt.offline import OfflineConfig
from pomt.options import option


@dataclass(frozen=True)
class Toy:
    size: int | tuple[int, int] | None = option(None, "A size.")
    rate: float = option(0.5, "A rate.", min=0)
    root: Path | str | None = option(None, "A folder.")
    kind: str = option("a", "A kind.", choices=("a", "b"))
    fast: bool = option(False, "Go fast.")
    shown: bool = option(True, "Show it.", negatable=True)


def _toy_app(seen: list) -> typer.Typer:
    toy = typer.Typer()

    @toy.command()
    @config_command(Toy)
    def run(config: Toy) -> None:
        """Record the config."""
        seen.append(config)

    return toy


def test_each_field_is_a_flag_with_its_default_and_type():
    seen: list = []
    runner = CliRunner()
    assert runner.invoke(_toy_app(seen), []).exit_code == 0
    assert seen[-1] == Toy()
    args = ["--size", "64", "--rate", "2", "--root", "/tmp/x", "--kind", "b", "--fast", "--no-shown"]
    assert runner.invoke(_toy_app(seen), args).exit_code == 0
    assert seen[-1] == Toy(size=64, rate=2.0, root=Path("/tmp/x"), kind="b", fast=True, shown=False)
    assert type(seen[-1].kind) is str  # choices arrive as plain strings, not enum members
    assert runner.invoke(_toy_app(seen), ["--kind", "c"]).exit_code == 2
    assert runner.invoke(_toy_app(seen), ["--rate", "-1"]).exit_code == 2
    assert "[a|b]" in runner.invoke(_toy_app(seen), ["--help"]).output.replace("<", "[").replace(">", "]")


def test_a_field_without_option_metadata_is_refused():
    @dataclass(frozen=True)
    class Bare:
        value: int = 1

    with pytest.raises(TypeError, match="'value' is not declared with pomt.options.option"):
        config_command(Bare)(lambda config: None)


@pytest.mark.parametrize(
    ("command", "configs", "negated"),
    [
        ("offline", [OfflineConfig], ["pretrained", "progress"]),
        ("bench", [BenchConfig, Outputs], ["pretrained", "profile"]),
    ],
)
def test_commands_take_every_config_field_as_a_flag(command, configs, negated):
    params = get_command(app).commands[command].params
    flags = {opt for param in params for opt in param.opts + param.secondary_opts}
    for config in configs:
        for f in dataclasses.fields(config):
            assert "--" + f.name.replace("_", "-") in flags, f.name
    assert {f"--no-{name}" for name in negated} <= flags
