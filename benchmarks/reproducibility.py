"""Does the same command give the same answer on this drifting machine? One offline command, run several
times in a row as a user runs it (a child process each, fresh output folder, live measurement).

Prints, per run: the confirmed steps (paired effect and interval), those within reach measured again in a
fresh process (`measurement.fresh_process_steps`), the removal R shipped and why, the
predicted gain and the verified speedups (each candidate, here and in a fresh process), the drift seen,
and the visits used against the full grid's.
Goal (issue 9): the same confirmed steps (+-2 tokens) and the same R (+-2) in every run, or every run
removing 0 for the same reason; <= 1/5 of the full grid's evaluations in every run.

Against a recorded trace (`-- --replay TRACE.csv`) the same seed replays the same visits, so the answer is
the same by construction: `--vary-seed` gives run i `--seed i` (its own pass orders and so its own recorded
visits), which asks without any timing whether the answer depends on which visits a run happened to get.
Usage: python benchmarks/reproducibility.py [--runs 3] [--model deit_small] [--batch-size 4] [--keep DIR]
       [--vary-seed] [-- extra options]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 2


def run_once(model: str, batch_size: int, extra: list[str], keep: Path | None = None) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as scratch:
        out = scratch if keep is None else str(keep)
        command = [sys.executable, str(ROOT / "offline_computation.py"), "--model", model, "--batch-size",
                   str(batch_size), "--output-dir", out, "--no-progress", *extra]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"run failed: {done.stderr.strip()}")
        (schedule,) = Path(out).glob("*.schedule.json")
        return json.loads(schedule.read_text()), wall


def seen_in(step: dict, others: list[dict]) -> bool:
    """The same step (a schedule's or `Step.to_dict()`'s) is among `others`: same kind, within TOLERANCE."""
    return any(abs(step["tokens"] - o["tokens"]) <= TOLERANCE and step["kind"] == o["kind"] for o in others)


def same_steps(a: list[dict], b: list[dict]) -> bool:
    return all(seen_in(s, b) for s in a) and all(seen_in(s, a) for s in b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="deit_small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each run's outputs (schedule, trace, plot) in KEEP/run-<i> to inspect or replay")
    parser.add_argument("--vary-seed", action="store_true",
                        help="run i gets --seed i (for --replay, where one seed replays the same visits)")
    parser.add_argument("extra", nargs="*", help="further offline_computation.py options (after --)")
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        keep = None if args.keep is None else args.keep / f"run-{i + 1}"
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        extra = [*args.extra, "--seed", str(i)] if args.vary_seed else args.extra
        schedule, wall = run_once(args.model, args.batch_size, extra, keep)
        results.append(schedule)
        m, v, p = schedule["measurement"], schedule.get("verified") or {}, schedule["policy"]
        remove = sum(item["remove"] for item in schedule["prune"])
        steps = ", ".join(f"{s['upper_tokens']}->{s['tokens']} {-s['paired_pct']:+.1f}% "
                          f"[{-s['paired_ci_pct'][1]:+.1f}, {-s['paired_ci_pct'][0]:+.1f}]" for s in schedule["steps"])
        drift = m["drift"]["drift_pct"] if m["drift"] else 0.0
        print(f"run {i + 1}: wall {wall:.0f} s; visits {m['visits']}/{m['full_grid_visits']} "
              f"({m['evaluation_ratio']:.3f} of the full grid); drift {drift:.1f}%; noise {m['noise_pct']:.2f}%")
        print(f"       confirmed steps: {steps or 'none'}; rejected candidates: {len(m['rejected'])}")
        checks = m.get("fresh_process_steps") or []
        if checks:
            print("       steps within reach in a fresh process: " + ", ".join(
                f"{f['high']}->{f['low']} here {-f['paired_pct']:+.1f}%, fresh {-f['fresh_pct']:+.1f}% "
                f"[{-f['fresh_ci_pct'][1]:+.1f}, {-f['fresh_ci_pct'][0]:+.1f}] {'held' if f['held'] else 'NOT held'}"
                for f in checks))
        verified = "not verified"
        if v:
            measured = [("verified", v["candidates"]),
                        ("in a fresh process", (v.get("fresh_process") or {}).get("candidates", []))]
            verified = "; ".join(f"{where} " + ", ".join(
                f"removing {c['remove']} {c['speedup']:.3f}x [{c['speedup_ci'][0]:.3f}, {c['speedup_ci'][1]:.3f}]"
                for c in candidates) for where, candidates in measured if candidates)
        print(f"       R = {remove} ({p['reason_code']}); predicted gain {100 * schedule['predicted']['gain']:.1f}%; "
              f"{verified}")
        print(f"       reason: {p['reason']}")
    removes = [sum(item["remove"] for item in s["prune"]) for s in results]
    codes = {s["policy"]["reason_code"] for s in results}
    steps_agree = all(same_steps(results[0]["steps"], s["steps"]) for s in results[1:])
    if all(r == 0 for r in removes):
        verdict = f"every run removes 0; reasons {'agree' if len(codes) == 1 else 'DIFFER'}: {sorted(codes)}"
        met = len(codes) == 1
    else:
        close = max(removes) - min(removes) <= 2 * TOLERANCE and min(removes) > 0
        verdict = f"R = {removes} ({'within +-2' if close else 'NOT within +-2'})"
        met = close and steps_agree
    ratios = [s["measurement"]["evaluation_ratio"] for s in results]
    print(f"\nconfirmed steps {'agree' if steps_agree else 'DIFFER'} within +-{TOLERANCE} tokens; {verdict}")
    print(f"goal (same answer): {'met' if met else 'NOT met'}; evaluations <= 1/5 of the full grid in every run: "
          f"{'met' if max(ratios) <= 0.2 else 'NOT met'} (max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
