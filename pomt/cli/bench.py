"""`pomt bench` (and benchmark.py): the unpruned model vs a schedule vs other reducers, side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from pomt.bench.report import format_sweep, format_table, write_benchmark, write_sweep
from pomt.bench.run import BenchConfig, run_benchmark, run_sweep
from pomt.bench.variants import VALID_METHODS
from pomt.cli.app import app
from pomt.errors import BatchSizeError, InputSizeError, PatchError


def _ints(text: str | None, what: str, error: type[Exception]) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise error(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise error(f"{what} is empty")
    return values


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(part.strip() for part in text.split(",") if part.strip())
    if not methods:
        raise PatchError(f"--methods is empty; choose one of {', '.join(VALID_METHODS)}")
    return methods


@app.command("bench")
def bench_command(
    model: str = typer.Option(None, "--model", help="timm name or alias (default: the schedule's model)."),
    schedule: Path = typer.Option(
        None, "--schedule", help="Schedule JSON to compare with the unpruned model."
    ),
    methods: str = typer.Option(
        "none",
        "--methods",
        help=f"Comma-separated variants: {', '.join(VALID_METHODS)} (none is always run).",
    ),
    remove: int = typer.Option(
        None, "--remove", help="Tokens removed at --prune-block (pomt/topk/l2norm/random)."
    ),
    keep_rate: float = typer.Option(
        None, "--keep-rate", help="Instead of --remove: patch tokens kept, in (0, 1]."
    ),
    r: int = typer.Option(None, "--r", help="ToMe: tokens merged per block."),
    prune_block: int = typer.Option(3, "--prune-block", help="Block that prunes (0-based)."),
    match_flops: bool = typer.Option(
        False, "--match-flops", help="Choose each reducer's amount to match the schedule's FLOPs."
    ),
    batch_size: int = typer.Option(
        None, "--batch-size", help="Batch size (default: the schedule's, else 1)."
    ),
    input_size: int = typer.Option(
        None, "--input-size", help="Input size in pixels (default: schedule's/model's)."
    ),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help="Sweep: comma-separated batch sizes."),
    input_sizes: str = typer.Option(None, "--input-sizes", help="Sweep: comma-separated input sizes."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    threads: int = typer.Option(None, "--threads", help="CPU threads (default: torch's)."),
    rounds: int = typer.Option(
        30, "--rounds", help="Interleaved timing rounds (one sample per variant each)."
    ),
    calls_per_round: int = typer.Option(1, "--calls-per-round", help="Back-to-back forwards per sample."),
    warmup: int = typer.Option(3, "--warmup", help="Warm-up forwards per variant."),
    dataset_root: Path = typer.Option(None, "--dataset-root", help="ImageFolder for top-1 accuracy."),
    accuracy_samples: int = typer.Option(
        32, "--accuracy-samples", help="Images for accuracy (top-1 or agreement on random inputs); 0: skip."
    ),
    checkpoint: Path = typer.Option(
        None, "--checkpoint", help="Local weights (state dict or timm checkpoint)."
    ),
    pretrained: bool = typer.Option(
        False, "--pretrained/--no-pretrained", help="Fetch timm's pretrained weights."
    ),
    output_dir: Path = typer.Option(Path("bin"), "--output-dir", help="Where the CSV/JSON/PNG go."),
    require_locked_clocks: bool = typer.Option(
        False, "--require-locked-clocks", help="Refuse to measure unless clocks are locked."
    ),
    profile: bool = typer.Option(
        True, "--profile/--no-profile", help="Count ops/kernels with torch.profiler."
    ),
    power_seconds: float = typer.Option(
        2.0, "--power-seconds", help="Seconds per variant of power sampling (GPU)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for inputs and random pruning."),
) -> None:
    """Compare the unpruned model with a schedule and other reducers: latency, FLOPs, memory, power, ops."""
    sweep_batches = _ints(batch_sizes, "--batch-sizes", BatchSizeError)
    sweep_sizes = _ints(input_sizes, "--input-sizes", InputSizeError)
    if rounds < 1 or calls_per_round < 1 or warmup < 0:
        raise PatchError("--rounds and --calls-per-round must be >= 1, --warmup >= 0")
    config = BenchConfig(
        model=model,
        schedule=schedule,
        methods=_methods(methods),
        remove=remove,
        r=r,
        prune_block=prune_block,
        keep_rate=keep_rate,
        match_flops=match_flops,
        batch_size=batch_size,
        input_size=input_size,
        device=device,
        threads=threads,
        rounds=rounds,
        calls_per_round=calls_per_round,
        warmup=warmup,
        dataset_root=dataset_root,
        accuracy_samples=accuracy_samples,
        checkpoint=checkpoint,
        pretrained=pretrained,
        require_locked_clocks=require_locked_clocks,
        profile=profile,
        power_seconds=power_seconds,
        seed=seed,
    )
    if sweep_batches is None and sweep_sizes is None:
        result = run_benchmark(config)
        typer.echo(format_table(result))
        paths = write_benchmark(result, output_dir)
    else:
        batches = sweep_batches or [batch_size or 1]
        sizes = sweep_sizes or ([input_size] if input_size else None)
        if sizes is None:
            raise InputSizeError("a sweep needs --input-sizes (or --input-size)")
        sweep = run_sweep(config, batches, sizes)
        for result in sweep.cells.values():
            typer.echo(format_table(result) + "\n")
        typer.echo(format_sweep(sweep))
        paths = write_sweep(sweep, output_dir)
    typer.echo("wrote " + ", ".join(str(path) for path in paths.values()))
