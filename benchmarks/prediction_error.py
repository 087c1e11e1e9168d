"""How far the latency model's promise is from the patched model on this machine.

For each workload the unpruned latency is probed, then the offline computation runs as a user runs it
(live, verification on) with a latency budget of `--budget` (default 90%) of that probe, so that the
budget policy ranks removals and verification measures them. Its schedule's
`verified` record holds, for every candidate it measured, the latency the model predicted (the curve plus
the method's own cost at its block, at the minute's speed) and what the patched model measured against the
unpruned one, paired. Printed: each candidate's predicted and measured latency and their error, the
shipped removal and its verified speedup.
Goal (issue 10): |prediction error| <= 3% for the shipped schedule on deit_small (batch 1 and 4) and
deit_tiny at 112 px (batch 1); a removal that does not pay is not shipped.
Usage: python benchmarks/prediction_error.py [--workloads deit_small:4:224 ...] [-- extra options]
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
WORKLOADS = ("deit_small:1:224", "deit_small:4:224", "deit_tiny:1:112")
GOAL = 0.03


def probe(model: str, batch: int, size: int) -> float:
    """The unpruned model's median latency (ms) here, roughly (the budget's scale)."""
    import torch

    from pomt.measurement.timing import time_callable
    from pomt.models.registry import create_model

    net = create_model(model, size)
    x = torch.randn(batch, 3, size, size)
    stats, _ = time_callable(lambda: net(x), min_run_s=1.0)
    return stats.median_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help="model:batch:input_size")
    parser.add_argument("--budget", type=float, default=0.9, help="latency budget as a fraction of unpruned")
    parser.add_argument("extra", nargs="*", help="further offline_computation.py options (after --)")
    args = parser.parse_args()
    shipped_errors = []
    for workload in args.workloads:
        model, batch, size = workload.split(":")
        budget = args.budget * probe(model, int(batch), int(size))
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, str(ROOT / "offline_computation.py"), "--model", model, "--batch-size", batch,
                       "--input-size", size, "--output-dir", out, "--no-progress", "--latency-budget-ms",
                       f"{budget:.3f}", *args.extra]
            start = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                print(f"{workload}: {done.stderr.strip()}")
                continue
            (path,) = Path(out).glob("*.schedule.json")
            schedule = json.loads(path.read_text())
        verified, remove = schedule.get("verified"), sum(item["remove"] for item in schedule["prune"])
        print(f"{workload}: wall {wall:.0f} s; shipped R = {remove} ({schedule['policy']['reason_code']})")
        if not verified:
            print(f"  nothing verified: {schedule['policy']['reason']}")
            continue
        print(f"  unpruned {verified['unpruned_ms']:.3f} ms; method cost at its block (ms): "
              f"{verified.get('method_cost_ms')}")
        for c in verified["candidates"]:
            error = c["pruned_ms"] / c["predicted_ms"] - 1 if c.get("predicted_ms") else None
            mark = "  <- shipped" if c["remove"] == remove else ""
            print(f"  remove {c['remove']:>4d}: predicted {c['predicted_ms']:.3f} ms, measured {c['pruned_ms']:.3f} ms "
                  f"({'-' if error is None else f'{100 * error:+.2f}%'}), speedup {c['speedup']:.3f}x "
                  f"[{c['speedup_ci'][0]:.3f}, {c['speedup_ci'][1]:.3f}]{mark}")
        if remove and verified.get("prediction_error") is not None:
            shipped_errors.append(abs(verified["prediction_error"]))
            within = abs(verified["prediction_error"]) <= GOAL
            print(f"  shipped: prediction error {100 * verified['prediction_error']:+.2f}% "
                  f"(goal within {100 * GOAL:.0f}%: {'met' if within else 'NOT met'})")
    if shipped_errors:
        print(f"\nlargest |error| of a shipped schedule: {100 * max(shipped_errors):.2f}%")


if __name__ == "__main__":
    main()
