"""What the host allocator costs a forward on this CPU: glibc's defaults against pomt's steady settings.

For each workload, one child process per allocator setting, the settings interleaved and the round repeated
(`--reps`, each setting first in turn), so that the machine's drift falls on every setting alike: each child
builds the unpruned model, warms it up, and times forwards (`pomt.measurement.timing.time_callable`), counting
the page faults the timed forwards took (`resource.getrusage`). Settings: glibc's defaults (the mmap threshold
adapts, the heap is trimmed at 128 KiB), `steady` (`pomt.device.allocator.STEADY`: both thresholds fixed high,
what CPU runs measure under by default) and the mmap threshold fixed at 128 KiB (pomt's advice before
2026-11-27). Printed per workload and setting: the median latency of each round, page faults per forward, and
the ratio to glibc's defaults of the same round (geometric mean, and the rounds' range). No timing threshold:
it prints what it measured. On the 2-core AMD VM (2026-11-27): steady 0.72x glibc's defaults on deit_tiny at
112 px and batch 16 (14 500 page faults a forward -> 25), 0.96x on deit_base at batch 4, 1.00x on deit_small
at batch 1; the 128 KiB threshold 1.14-1.47x.
Usage: python benchmarks/allocator.py [--workloads deit_tiny:16:112 deit_small:1:224 deit_base:4:224]
       [--reps 3] [--threads 2] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

from pomt.device.allocator import ALLOCATOR_ENV, STEADY

SETTINGS = {"glibc defaults": {}, "steady (pomt)": dict(STEADY),
            "mmap threshold 128 KiB": {"MALLOC_MMAP_THRESHOLD_": "131072"}}
WORKLOADS = ("deit_tiny:16:112", "deit_small:1:224", "deit_base:4:224")


def child(args: argparse.Namespace) -> None:
    """One setting's measurement, as a JSON line: median ms and page faults per timed forward."""
    import resource

    import torch

    from pomt.measurement.timing import time_callable
    from pomt.models.registry import create_model, resolve_model_name

    model, batch, size = args.child.split(":")
    torch.manual_seed(0)
    net = create_model(resolve_model_name(model), int(size)).eval()
    x = torch.randn(int(batch), 3, int(size), int(size))
    with torch.inference_mode():
        for _ in range(3):
            net(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    stats, _ = time_callable(lambda: net(x), threads=args.threads, warmup=0, min_run_s=args.seconds)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"median_ms": stats.median_ms, "faults": faults / stats.samples}))


def measure(workload: str, setting: dict, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV} | setting
    out = subprocess.run([sys.executable, __file__, "--child", workload, "--threads", str(args.threads),
                          "--seconds", str(args.seconds)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(workload: str, rounds: list[dict[str, dict]]) -> None:
    print(f"{workload} ({len(rounds)} rounds, settings interleaved):")
    for label in SETTINGS:
        ms = [r[label]["median_ms"] for r in rounds]
        ratios = [r[label]["median_ms"] / r["glibc defaults"]["median_ms"] for r in rounds]
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        faults = sum(r[label]["faults"] for r in rounds) / len(rounds)
        print(f"  {label:24s} {' '.join(f'{m:8.2f}' for m in ms)} ms   {faults:9.0f} page faults a forward   "
              f"latency / glibc defaults {mean:.3f} [{min(ratios):.3f}, {max(ratios):.3f}]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help="model:batch:input size")
    parser.add_argument("--reps", type=int, default=3, help="rounds of all settings, interleaved")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per child")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    for workload in args.workloads:
        labels = list(SETTINGS)
        rounds = [{label: measure(workload, SETTINGS[label], args) for label in labels[r % 3:] + labels[:r % 3]}
                  for r in range(args.reps)]  # each setting first in one round of three
        report(workload, rounds)


if __name__ == "__main__":
    main()
