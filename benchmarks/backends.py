"""Does a schedule's speedup, and do the latency steps, carry over from eager PyTorch to other runtimes?

deit_small (seeded random weights) on this CPU, at each batch size:
1. the removal: `--schedule`, or `--remove`, or the smallest pomt removal at block 3 among a few
   candidates that an interleaved eager measurement says pays >= 10% (else the largest candidate);
2. latency of the unpruned and the scheduled model in every runtime, all variants interleaved in one
   round-robin (median and IQR per variant), and the schedule's speedup in each runtime;
3. a kept-token curve per runtime (tokens dropped after the embedding; a coarse grid visited in shuffled
   passes, every runtime measured at each count in turn) with the steps `detect_steps` finds in each,
   printed side by side.
Programs are exported once per (runtime, token count) and cached in `--cache-dir`. Figures only, no
thresholds; on a shared machine run it more than once before reading anything into the numbers.
Usage: python benchmarks/backends.py [--quick] [--batch 1 4] [--backends eager,compile,onnxruntime,openvino]
       [--schedule S.json | --remove R] [--threads 1] [--rounds 30] [--passes 3] [--stride 16]
"""

from __future__ import annotations

import argparse
import copy
import random
from pathlib import Path

import numpy as np
import timm
import torch
from torch import nn

from pomt.geometry import model_geometry
from pomt.measure import LatencyPoint, interleaved, measure_point
from pomt.patching import patch
from pomt.runtime import build_forward, check_backend
from pomt.schedule import load_schedule
from pomt.search import steps_of_points

MODEL = "deit_small_patch16_224"
BLOCK = 3
CANDIDATES = (28, 56, 84, 112)
MIN_SPEEDUP = 1.10


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--backends", default="eager,compile,onnxruntime,openvino")
    parser.add_argument("--schedule", type=Path, help="schedule JSON for deit_small (its method and removal)")
    parser.add_argument("--remove", type=int, help="pomt removal at block 3 (default: chosen by eager timing)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds for the speedups")
    parser.add_argument("--passes", type=int, default=3, help="shuffled passes over the curve's grid")
    parser.add_argument("--stride", type=int, default=16, help="curve grid step in tokens")
    parser.add_argument("--min-run-s", type=float, default=0.2, help="timing per curve point and pass")
    parser.add_argument("--cache-dir", type=Path, default=Path("bin/cache/backends"))
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks that it runs end to end")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.rounds, args.passes, args.stride, args.min_run_s = [1], 4, 2, 64, 0.02
        args.remove = args.remove or 56
    return args


def plan(args: argparse.Namespace, model: nn.Module, x: torch.Tensor) -> tuple[str, dict[int, int]]:
    """(method, {block: remove}) of the schedule to compare."""
    if args.schedule is not None:
        schedule = load_schedule(args.schedule)
        schedule.check_geometry(model_geometry(model))
        return schedule.method, schedule.removal
    if args.remove is not None:
        return "pomt", {BLOCK: args.remove}
    variants = {"unpruned": copy.deepcopy(model)}
    variants |= {f"R={r}": patch(copy.deepcopy(model), "pomt", {BLOCK: r}) for r in CANDIDATES}
    stats = interleaved({k: (lambda m=m: m(x)) for k, m in variants.items()}, "cpu", args.threads,
                        args.rounds).stats
    base = stats["unpruned"].median_ms
    speedups = {r: base / stats[f"R={r}"].median_ms for r in CANDIDATES}
    print("eager pomt removals at block 3: " + "  ".join(f"R={r}: x{s:.3f}" for r, s in speedups.items()))
    paying = [r for r, s in speedups.items() if s >= MIN_SPEEDUP]
    chosen = paying[0] if paying else CANDIDATES[-1]
    print(f"chosen R={chosen} ({'smallest paying >= 10%' if paying else 'none pays 10%: the largest'})")
    return "pomt", {BLOCK: chosen}


def speedups(args, backends, model, x, method, removal) -> None:
    """Unpruned vs scheduled in every runtime, all variants interleaved."""
    forwards = {}
    for backend in backends:
        pruned = patch(copy.deepcopy(model), method, removal)
        for name, variant in (("unpruned", copy.deepcopy(model)), ("pruned", pruned)):
            forwards[(backend, name)] = build_forward(variant, x, backend=backend, device="cpu",
                                                      cache_dir=args.cache_dir, threads=args.threads)
    stats = interleaved({f"{b}/{n}": f for (b, n), f in forwards.items()}, "cpu", args.threads, args.rounds).stats
    print(f"{'runtime':<12} {'unpruned ms (IQR)':>20} {'pruned ms (IQR)':>20} {'speedup med':>12} {'speedup min':>12}")
    for backend in backends:
        a, b = stats[f"{backend}/unpruned"], stats[f"{backend}/pruned"]
        print(f"{backend:<12} {a.median_ms:>11.2f} ({a.iqr_ms:5.2f}) {b.median_ms:>11.2f} ({b.iqr_ms:5.2f}) "
              f"{a.median_ms / b.median_ms:>12.3f} {a.min_ms / b.min_ms:>12.3f}")
    for forward in forwards.values():
        forward.close()


def curves(args, backends, model, x) -> dict[str, list[LatencyPoint]]:
    """Shuffled passes over a coarse grid; at each count every runtime in turn (shuffled too)."""
    geometry = model_geometry(model)
    grid = sorted({*range(geometry.num_tokens, geometry.min_tokens - 1, -args.stride), geometry.min_tokens})
    forwards = {}
    for backend in backends:
        for n in grid:
            source = copy.deepcopy(model) if backend == "eager" else model  # eager keeps its token hook
            forwards[(backend, n)] = build_forward(source, x, backend=backend, device="cpu", tokens=n,
                                                   cache_dir=args.cache_dir, threads=args.threads)
    rng = random.Random(0)
    medians: dict[tuple[str, int], list[float]] = {key: [] for key in forwards}
    iqrs: dict[tuple[str, int], list[float]] = {key: [] for key in forwards}
    for _ in range(args.passes):
        for n in rng.sample(grid, len(grid)):
            for backend in rng.sample(backends, len(backends)):
                point = measure_point(forwards[(backend, n)], n, threads=args.threads, min_run_s=args.min_run_s,
                                      retries=0)
                medians[(backend, n)].append(point.median_ms)
                iqrs[(backend, n)].append(point.iqr_ms)
    for forward in forwards.values():
        forward.close()
    return {
        backend: [
            LatencyPoint(n, float(np.median(medians[(backend, n)])), float(np.median(iqrs[(backend, n)])),
                         args.passes, args.threads, "cpu")
            for n in grid
        ]
        for backend in backends
    }


def print_curves(points: dict[str, list[LatencyPoint]]) -> None:
    backends = list(points)
    print("kept tokens  " + "".join(f"{b:>13}" for b in backends) + "   (median ms over passes)")
    grid = [p.tokens for p in points[backends[0]]]
    for i, n in enumerate(grid):
        print(f"{n:>11}  " + "".join(f"{points[b][i].median_ms:>13.3f}" for b in backends))
    print("steps found (high -> low tokens, latency change, significance):")
    for backend in backends:
        report = steps_of_points(points[backend])
        found = ", ".join(f"{s.upper_tokens}->{s.tokens} {-s.drop_pct:+.1f}% ({s.significance:.0f} sigma)"
                          for s in report.steps) or "none"
        print(f"  {backend:<12} {found}")


def main() -> None:
    args = parse()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for backend in backends:
        check_backend(backend, "cpu")
    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False).eval()
    torch.set_num_threads(args.threads)
    print(f"{MODEL} random weights, cpu, threads={args.threads}, backends: {', '.join(backends)}; "
          f"cache {args.cache_dir}")
    for batch in args.batch:
        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
        print(f"\n=== batch {batch} ===")
        method, removal = plan(args, model, x)
        print(f"schedule: {method} {removal}")
        speedups(args, backends, model, x, method, removal)
        print_curves(curves(args, backends, model, x))


if __name__ == "__main__":
    main()
