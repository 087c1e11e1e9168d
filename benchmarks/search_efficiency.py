"""Adaptive against full grid search on this machine's CPU: device time, and whether adaptive finds the
steps that the full grid shows (random-weight model, real latency via `pomt.measure.measure_point`).

Usage: .venv/bin/python benchmarks/search_efficiency.py [--model deit_small] [--batch-size 4]
       [--threads 2] [--stride 1] [--min-run-s 0.2] [--k 5]
Goal: adaptive / full device time <= 1/5, every full-grid step with a drop >= 5 % found within 2 tokens.
"""

from __future__ import annotations

import argparse
import time

import torch

from pomt.geometry import model_geometry
from pomt.measure import LatencyPoint, measure_point
from pomt.models import create_model
from pomt.search import adaptive_search, full_search, steps_of_points, token_grid
from pomt.tokens import truncate_tokens

GOAL_RATIO = 0.2
BIG_PCT = 5.0
TOLERANCE = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--min-run-s", type=float, default=0.2)
    parser.add_argument("--k", type=float, default=5.0)
    args = parser.parse_args()

    model = create_model(args.model, pretrained=False)
    geometry = model_geometry(model)
    size = geometry.input_size
    x = torch.randn(args.batch_size, 3, size[0], size[1])
    grid = token_grid(geometry.num_tokens, geometry.min_tokens, args.stride,
                      min_tokens=geometry.min_tokens, max_tokens=geometry.num_tokens)

    def measure(n: int) -> LatencyPoint:
        with truncate_tokens(model, n):
            return measure_point(lambda: model(x), n, threads=args.threads, min_run_s=args.min_run_s)

    start = time.perf_counter()
    full = full_search(measure, grid, progress=False)
    full_s = time.perf_counter() - start
    calls: list[int] = []

    def counted(n: int) -> LatencyPoint:
        calls.append(n)
        return measure(n)

    start = time.perf_counter()
    adaptive = adaptive_search(counted, grid, k=args.k, progress=False)
    adaptive_s = time.perf_counter() - start

    full_report = steps_of_points(full.values(), args.k)
    adaptive_report = steps_of_points(adaptive.values(), args.k)
    print(f"model {geometry.model}  batch {args.batch_size}  threads {args.threads}  "
          f"grid {grid[0]}..{grid[-1]} stride {args.stride}  ({len(grid)} counts)")
    print(f"full grid   {full_s:8.1f} s   {len(grid)} evaluations   noise {full_report.noise_ms:.3f} ms")
    print(f"adaptive    {adaptive_s:8.1f} s   {len(calls)} evaluations   noise {adaptive_report.noise_ms:.3f} ms")
    ratio = adaptive_s / full_s
    print(f"ratio       {ratio:8.3f}   (goal <= {GOAL_RATIO:g}: {'met' if ratio <= GOAL_RATIO else 'NOT met'})")
    print(f"steps on the full grid: {len(full_report.steps)}; adaptive found {len(adaptive_report.steps)}")
    big = [s for s in full_report.steps if abs(s.drop_pct) >= BIG_PCT]
    print(f"full-grid steps with |drop| >= {BIG_PCT:g}%: {len(big)}")
    for step in big:
        hit = [s for s in adaptive_report.steps if s.kind == step.kind
               and abs(s.tokens - step.tokens) <= TOLERANCE]
        where = f"found at {hit[0].upper_tokens} -> {hit[0].tokens}" if hit else "MISSED"
        print(f"  {step.upper_tokens:4d} -> {step.tokens:<4d} {step.kind:4s} {-step.drop_pct:+6.1f}% "
              f"({step.significance:5.1f} se): adaptive {where}")
    for step in full_report.steps:
        if abs(step.drop_pct) < BIG_PCT:
            print(f"  (small) {step.upper_tokens:4d} -> {step.tokens:<4d} {step.kind:4s} {-step.drop_pct:+6.1f}%")


if __name__ == "__main__":
    main()
