"""`pomt bench` (and benchmark.py): the unpruned model vs a schedule vs other reducers, side by side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from pomt.bench.config import BenchConfig
from pomt.bench.report import format_sweep, format_table, write_benchmark, write_sweep
from pomt.bench.run import run_benchmark, run_sweep
from pomt.checks import check_output_dir
from pomt.cli.app import app, interrupted_means
from pomt.cli.options import config_command
from pomt.errors import BatchSizeError, InputSizeError
from pomt.options import OUTPUTS, WORKLOAD, option


@dataclass(frozen=True)
class Outputs:
    """The options of the command itself: a sweep instead of one run, and where the files go."""

    batch_sizes: str | None = option(None, "Sweep: comma-separated batch sizes.", panel=WORKLOAD)
    input_sizes: str | None = option(None, "Sweep: comma-separated input sizes.", panel=WORKLOAD)
    output_dir: Path = option(Path("bin"), "Where the CSV/JSON/PNG go.", panel=OUTPUTS)


def _ints(text: str | None, what: str, error: type[Exception]) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise error(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise error(f"{what} is empty")
    if min(values) < 1:
        raise error(f"{what} must be positive integers, got {text!r}")
    return values


@app.command("bench")
@config_command(BenchConfig, Outputs)
def bench_command(config: BenchConfig, outputs: Outputs) -> None:
    """Compare the unpruned model with a schedule and other reducers: latency, FLOPs, memory, power, ops."""
    batches = _ints(outputs.batch_sizes, "--batch-sizes", BatchSizeError)
    sizes = _ints(outputs.input_sizes, "--input-sizes", InputSizeError)
    check_output_dir(outputs.output_dir)
    with interrupted_means("interrupted; a benchmark keeps no journal: nothing was written, run it again"):
        _bench(config, outputs, batches, sizes)


def _bench(config: BenchConfig, outputs: Outputs, batches: list[int] | None, sizes: list[int] | None) -> None:
    if batches is None and sizes is None:
        result = run_benchmark(config)
        typer.echo(format_table(result))
        paths = write_benchmark(result, outputs.output_dir)
    else:
        sizes = sizes or ([config.input_size] if config.input_size else None)
        if sizes is None:
            raise InputSizeError("a sweep needs --input-sizes (or --input-size)")
        sweep = run_sweep(config, batches or [config.batch_size or 1], sizes)
        for result in sweep.cells.values():
            typer.echo(format_table(result) + "\n")
        typer.echo(format_sweep(sweep))
        paths = write_sweep(sweep, outputs.output_dir)
    typer.echo("wrote " + ", ".join(str(path) for path in paths.values()))
