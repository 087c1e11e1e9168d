"""`pomt record`: a dense latency trace of one workload, for the curve bank and `--replay`."""

from __future__ import annotations

import typer

from pomt.cli.app import app
from pomt.cli.options import config_command
from pomt.workload.prepare import Workload
from pomt.workload.record import RecordSettings, record


@app.command("record")
@config_command(Workload, RecordSettings)
def record_command(workload: Workload, settings: RecordSettings) -> None:
    """Record every timed forward of every kept-token count in shuffled passes, with the device fingerprint."""
    done = record(workload, settings)
    echo = typer.echo
    echo(f"recorded   {done.visits} visits ({done.measured} measured now, {done.samples} timed forwards) in "
         f"{done.seconds:.0f} s; noise {100 * done.noise:.1f}% a visit")
    if done.drift is not None:
        echo(f"drift      reference {done.drift.reference_tokens} tokens: max/min {done.drift.max_over_min:.2f} "
             f"over {len(done.drift.reference_ms)} passes{done.drift.one_pass_words()}")
    echo(f"steps      {len(done.steps)} confirmed by paired visits within passes (>= {100 * settings.min_step:.0f}%)")
    for s in done.steps:
        echo(f"  {s.upper_tokens:>5d} -> {s.tokens:<5d} {s.kind}: {-s.paired_pct:+.1f}% beyond the trend, "
             f"p={s.p_value:.2g}")
    for kind, path in done.paths.items():
        echo(f"wrote      {kind:8s} {path}")
