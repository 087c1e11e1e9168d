"""Does a schedule's speedup, and do the latency steps, carry over from eager PyTorch to other runtimes?

deit_small (seeded random weights) on this CPU, at each batch size:
1. the removal: `--schedule`, or `--remove`, or the smallest pomt removal at block 3 among a few
   candidates that an interleaved eager measurement says pays >= 10% (else the largest candidate);
2. latency of the unpruned and the scheduled model in every runtime, all variants interleaved in one
   round-robin (median and IQR per variant), and the schedule's speedup in each runtime;
3. a kept-token curve per runtime (tokens dropped after the embedding; a coarse grid visited in shuffled
   passes, drift-corrected, candidate steps confirmed by paired measurement: `pomt.measurement.search`), per runtime,
   printed side by side.
Programs are exported once per (runtime, token count) and cached in `--cache-dir`. Figures only, no
thresholds; on a shared machine run it more than once before reading anything into the numbers.
Usage: python benchmarks/backends.py [--quick] [--batch 1 4] [--backends eager,compile,onnxruntime,openvino]
       [--schedule S.json | --remove R] [--threads 1] [--rounds 30] [--passes 3] [--stride 16] [--reps 3]
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import timm
import torch
from torch import nn

from pomt.formats.schedule import load_schedule
from pomt.measurement.search import LatencySearch, SearchResult, SearchScope, SearchSettings
from pomt.measurement.sources import LiveSource, MeasurementRun, live_forwards
from pomt.measurement.timing import interleaved
from pomt.models.geometry import model_geometry
from pomt.patching import patch
from pomt.runtimes import ProgramFiles, build_forward, check_backend

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
    parser.add_argument("--reps", type=int, default=3, help="timed forwards per visit of the curve")
    parser.add_argument("--confirm-rounds", type=int, default=6, help="paired rounds confirming a step")
    parser.add_argument("--cache-dir", type=Path, default=Path("bin/cache/backends"))
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks that it runs end to end")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.rounds, args.passes, args.stride, args.reps, args.confirm_rounds = [1], 4, 2, 64, 1, 3
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
            forwards[(backend, name)] = build_forward(variant, x, backend=backend, threads=args.threads,
                                                      files=ProgramFiles(args.cache_dir))
    stats = interleaved({f"{b}/{n}": f for (b, n), f in forwards.items()}, "cpu", args.threads, args.rounds).stats
    print(f"{'runtime':<12} {'unpruned ms (IQR)':>20} {'pruned ms (IQR)':>20} {'speedup med':>12} {'speedup min':>12}")
    for backend in backends:
        a, b = stats[f"{backend}/unpruned"], stats[f"{backend}/pruned"]
        print(f"{backend:<12} {a.median_ms:>11.2f} ({a.iqr_ms:5.2f}) {b.median_ms:>11.2f} ({b.iqr_ms:5.2f}) "
              f"{a.median_ms / b.median_ms:>12.3f} {a.min_ms / b.min_ms:>12.3f}")
    for forward in forwards.values():
        forward.close()


def curves(args, backends, model, x) -> dict[str, SearchResult]:
    """Per runtime, the full search over a coarse grid (shuffled passes, drift-corrected pooling, paired
    confirmation of every candidate step): `pomt.measurement.search` as the offline computation runs it."""
    geometry = model_geometry(model)
    grid = sorted({*range(geometry.num_tokens, geometry.min_tokens - 1, -args.stride), geometry.min_tokens})
    settings = SearchSettings(passes=args.passes, reps=args.reps, confirm_rounds=args.confirm_rounds)
    results = {}
    for backend in backends:
        forward_at = live_forwards(model, x, backend=backend, threads=args.threads, cache_dir=args.cache_dir)
        measuring = MeasurementRun(LiveSource(forward_at, "cpu", args.threads, backend=backend))
        results[backend] = LatencySearch(measuring, SearchScope(grid, geometry.num_tokens, adaptive=False), settings,
                                         progress=False).run()
    return results


def print_curves(results: dict[str, SearchResult]) -> None:
    backends = list(results)
    print("kept tokens  " + "".join(f"{b:>13}" for b in backends) + "   (pooled ms, drift-corrected)")
    for i, point in enumerate(results[backends[0]].points):
        print(f"{point.tokens:>11}  " + "".join(f"{results[b].points[i].latency_ms:>13.3f}" for b in backends))
    print("steps confirmed by paired measurement (high -> low tokens, change beyond the trend, interval):")
    for backend in backends:
        found = ", ".join(f"{s.upper_tokens}->{s.tokens} {-s.paired_pct:+.1f}% "
                          f"[{-s.paired_ci_pct[1]:+.1f}, {-s.paired_ci_pct[0]:+.1f}]"
                          for s in results[backend].steps) or "none"
        print(f"  {backend:<12} {found}  (drift {results[backend].drift.pct:.1f}%)")


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
