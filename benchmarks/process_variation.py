"""Does a step hold from one process to the next? Records the same narrow band of counts just below N in
several fresh processes (`pomt record`, a child process each) and compares what each trace confirms.

A schedule is measured in one process and served in another. On the 2-core VM, deit_small at batch 4 ran
about 9% faster one token below N in one offline run and showed no step there in the next five: the
measurement agreed with itself within each run (paired rounds, then the patched model verified), so the
step itself moved between processes. This benchmark measures that directly: per process, each count's
level relative to N (pooled over shuffled passes, drift-corrected) and the steps its trace confirms
(`pomt.measurement.steps.steps_in_trace`); then each step with the number of processes that confirmed it
(within +-2 tokens, same kind).
Usage: python benchmarks/process_variation.py [--processes 4] [--model deit_small] [--batch-size 4]
       [--below 8] [--passes 10] [--min-step 0.03] [-- extra pomt record options]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from reproducibility import ROOT, TOLERANCE, seen_in

from pomt.formats.trace import read_trace
from pomt.measurement.drift import pool_visits
from pomt.measurement.steps import Step, steps_in_trace
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model


def record_band(model: str, batch_size: int, lowest: int, passes: int, extra: list[str], out: Path) -> Path:
    """One fresh process records counts `lowest` .. N; returns its trace."""
    command = [sys.executable, "-m", "pomt", "record", "--model", model, "--batch-size", str(batch_size),
               "--grid-token-stop", str(lowest), "--passes", str(passes), "--output-dir", str(out), "--no-progress",
               *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pomt record failed: {done.stderr.strip().splitlines()[-1:]}")
    (trace,) = out.glob("*.record.csv")
    return trace


def persistence(found: list[list[Step]]) -> list[tuple[dict, int]]:
    """Each distinct step (the first process's reading of it; the same step as `reproducibility.py` judges
    it) with the number of processes that confirmed it."""
    readings = [[s.to_dict() for s in steps] for steps in found]
    distinct: list[dict] = []
    for steps in readings:
        distinct += [s for s in steps if not seen_in(s, distinct)]
    return [(s, sum(seen_in(s, steps) for steps in readings)) for s in sorted(distinct, key=lambda s: -s["tokens"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--model", default="deit_small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--below", type=int, default=8, help="counts recorded: N - below .. N")
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--min-step", type=float, default=0.03, help="smallest step reported (fraction)")
    parser.add_argument("extra", nargs="*", help="further pomt record options (after --)")
    args = parser.parse_args()
    lowest = model_geometry(create_model(args.model)).num_tokens - args.below
    found: list[list[Step]] = []
    for i in range(args.processes):
        with tempfile.TemporaryDirectory() as scratch:
            trace = read_trace(record_band(args.model, args.batch_size, lowest, args.passes, args.extra,
                                           Path(scratch)))
        n = trace.num_tokens
        levels = {p.tokens: p.relative for p in pool_visits(trace.visits, n)}
        steps = steps_in_trace(trace.visits, min_step=args.min_step)
        found.append(steps)
        shown = " ".join(f"{k}:{levels[k]:.3f}" for k in sorted(levels, reverse=True))
        listed = ", ".join(f"{s.upper_tokens}->{s.tokens} {-s.paired_pct:+.1f}%" for s in steps) or "none"
        print(f"process {i + 1}: level / level at N = {shown}")
        print(f"           steps of {100 * args.min_step:g}% or more its trace confirms: {listed}")
    print(f"\nsteps, and the processes (of {args.processes}) that confirmed each within +-{TOLERANCE} tokens:")
    table = persistence(found)
    for step, seen in table:
        print(f"  {step['upper_tokens']}->{step['tokens']} {step['kind']}: {seen}/{args.processes}")
    every = sum(seen == args.processes for _, seen in table)
    print(f"steps every process confirmed: {every}; steps only some did: {len(table) - every}")


if __name__ == "__main__":
    main()
