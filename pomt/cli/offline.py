"""`pomt offline` (= `python offline_computation.py`): measure, detect steps, schedule."""

from __future__ import annotations

import typer

from pomt.cli.app import app
from pomt.cli.options import config_command
from pomt.offline import OfflineConfig, OfflineResult, run_offline


@app.command("offline")
@config_command(OfflineConfig)
def offline_command(config: OfflineConfig) -> None:
    """Measure latency against kept tokens, find the steps, choose a removal, and save the schedule."""
    print_report(run_offline(config), config.batch_size)


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
