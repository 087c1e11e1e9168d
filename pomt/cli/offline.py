"""`pomt offline` (= `python offline_computation.py`): measure, detect steps, schedule."""

from __future__ import annotations

from pathlib import Path

import typer

from pomt.cli.app import app
from pomt.offline import OfflineConfig, OfflineResult, run_offline


@app.command("offline")
def offline_command(
    model: str = typer.Option("deit_base", "--model", help="timm model name or alias."),
    batch_size: int = typer.Option(4, "--batch-size", help="Batch size the schedule is for."),
    input_size: int = typer.Option(None, "--input-size", help="Input size in pixels (default: the model's)."),
    device: str = typer.Option("auto", "--device", help="auto (cuda if present, else cpu), cpu, cuda[:N], mps."),
    threads: int = typer.Option(None, "--threads", help="CPU threads, fixed and recorded (default: torch's)."),
    grid_token_start: int = typer.Option(None, "--grid-token-start", help="First kept-token count (default N)."),
    grid_token_stop: int = typer.Option(None, "--grid-token-stop", help="Last kept-token count (default P+1)."),
    grid_token_stride: int = typer.Option(1, "--grid-token-stride", help="Grid step in tokens."),
    search: str = typer.Option("adaptive", "--search", help="adaptive (coarse grid, refine at steps) or full."),
    coarse_stride: int = typer.Option(None, "--coarse-stride", help="Adaptive search's first-pass stride."),
    significance: float = typer.Option(5.0, "--significance", help="Steps must exceed this many noise units."),
    min_run_s: float = typer.Option(0.2, "--min-run-s", help="Seconds of timing per latency point (at least)."),
    dataset_root: Path = typer.Option(None, "--dataset-root", help="ImageFolder for accuracy (top-1), or a "
                                      "folder of images (agreement with the unpruned model)."),
    checkpoint: Path = typer.Option(None, "--checkpoint", help="Local checkpoint (state dict or timm file)."),
    pretrained: bool = typer.Option(None, "--pretrained/--no-pretrained", help="Pretrained weights "
                                    "(default: only when accuracy is measured and no checkpoint is given)."),
    accuracy_samples: int = typer.Option(500, "--accuracy-samples", help="Images in the seeded accuracy sample."),
    accuracy_points: int = typer.Option(12, "--accuracy-points", help="Token counts at which A(n) is measured."),
    alpha: float = typer.Option(0.5, "--alpha", help="Utility weight of latency against accuracy."),
    policy: str = typer.Option(None, "--policy", help="utility, step or budget (default: budget with a "
                               "budget, utility with accuracy, else step)."),
    latency_budget_ms: float = typer.Option(None, "--latency-budget-ms", help="Latency the schedule must meet."),
    min_accuracy: float = typer.Option(None, "--min-accuracy", help="Lowest acceptable A(n), in [0, 1]."),
    max_remove: int = typer.Option(None, "--max-remove", help="Most tokens the schedule may remove."),
    min_gain: float = typer.Option(0.03, "--min-gain", help="Least predicted gain (fraction) worth pruning for."),
    prune_block: int = typer.Option(3, "--prune-block", help="Block (0-based) where tokens are removed."),
    method: str = typer.Option("pomt", "--method", help="Reducer the schedule is applied with."),
    output_dir: Path = typer.Option(Path("bin"), "--output-dir", help="Where outputs are written."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed search; measure only what is missing."),
    require_locked_clocks: bool = typer.Option(False, "--require-locked-clocks",
                                               help="Refuse to measure unless clocks are locked."),
    latency_only: bool = typer.Option(False, "--latency-only", help="Measure latency only (no accuracy)."),
    accuracy_only: bool = typer.Option(False, "--accuracy-only", help="Estimate accuracy only; write its CSV."),
    accuracy_curve: Path = typer.Option(None, "--accuracy-curve", help="Accuracy CSV from an --accuracy-only run."),
    seed: int = typer.Option(0, "--seed", help="Seed for the accuracy sample and random pruning."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Measure latency against kept tokens, find the steps, choose a removal, and save the schedule."""
    config = OfflineConfig(
        model=model, batch_size=batch_size, input_size=input_size, device=device, threads=threads,
        grid_start=grid_token_start, grid_stop=grid_token_stop, grid_stride=grid_token_stride, search=search,
        coarse_stride=coarse_stride, significance=significance, min_run_s=min_run_s, dataset_root=dataset_root,
        checkpoint=checkpoint, pretrained=pretrained, accuracy_samples=accuracy_samples,
        accuracy_points=accuracy_points, alpha=alpha, policy=policy, latency_budget_ms=latency_budget_ms,
        min_accuracy=min_accuracy, max_remove=max_remove, min_gain=min_gain, prune_block=prune_block,
        method=method, output_dir=output_dir, resume=resume, require_locked_clocks=require_locked_clocks,
        latency_only=latency_only, accuracy_only=accuracy_only, accuracy_curve=accuracy_curve, seed=seed,
        progress=progress,
    )
    print_report(run_offline(config), batch_size)


def print_report(result: OfflineResult, batch_size: int) -> None:
    """A short human report: geometry, steps, choice, prediction, files."""
    g = result.geometry
    echo = typer.echo
    echo(f"model      {g.model}  {g.input_size[0]}x{g.input_size[1]} px  batch {batch_size}  "
         f"N={g.num_tokens} (prefix {g.prefix_tokens})  depth {g.depth}")
    echo(f"device     {result.device.get('name')}  threads {result.device.get('threads')}  "
         f"clocks_locked={result.device.get('clocks_locked')}")
    if result.points:
        echo(f"latency    {len(result.points)} counts known, {result.measured_points} measured this run "
             f"in {result.measure_seconds:.0f} s; noise {result.report.noise_ms:.3f} ms; "
             f"embed+head {result.overhead_ms:.2f} ms")
        echo(f"steps      {len(result.report.steps)} found" + (":" if result.report.steps else ""))
        for step in result.report.steps:
            echo(f"  {step.upper_tokens:>5d} -> {step.tokens:<5d} {step.before_ms:9.3f} -> {step.after_ms:9.3f} ms "
                 f"({-step.drop_pct:+.1f}%, {step.kind}, {step.significance:.1f} sigma)")
    if result.accuracy:
        values = result.accuracy.values
        echo(f"accuracy   {result.accuracy.kind} on {result.accuracy.samples} images: "
             f"{values[max(values)]:.3f} at {max(values)} tokens, {values[min(values)]:.3f} at {min(values)}")
    if result.decision:
        d = result.decision
        echo(f"schedule   remove {d.remove} tokens at block {d.block} -> keep {d.kept_tokens}  "
             f"(policy {d.policy}: {d.reason})")
        echo(f"predicted  {d.baseline_ms:.3f} ms -> {d.predicted_ms:.3f} ms  (gain {100 * d.gain:.1f}%"
             + (f", accuracy {d.accuracy:.3f})" if d.accuracy is not None else ")"))
    for kind, path in result.paths.items():
        echo(f"wrote      {kind:9s} {path}")
