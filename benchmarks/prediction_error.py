"""How far the latency model's promise is from the patched model on this machine.

Two parts (`--part`, both by default).

single: for each workload the unpruned latency is probed, then the offline computation runs as a user runs it
(live, verification on) with a latency budget of `--budget` (default 90%) of that probe, so that the
budget policy ranks removals and verification measures them. Its schedule's
`verified` record holds, for every candidate it measured, the latency the model predicted (the curve plus
the method's own cost at its block, at the minute's speed) and what the patched model measured against the
unpruned one, paired. Printed: each candidate's predicted and measured latency and their error, the
shipped removal and its verified speedup.
Goal (issue 10): |prediction error| <= 3% for the shipped schedule on deit_small (batch 1 and 4) and
deit_tiny at 112 px (batch 1); a removal that does not pay is not shipped.

multi: for each workload, multi-block schedules of every reducer (pomt, topk, tome, l2norm: two and three
pruning blocks, ToMe's constant and decreasing r and a front-loaded ToMe schedule) priced by
`pomt.frontier.latency.LatencyModel` from a curve L(n) (`--curve-points` counts) and each reducer's own
cost measured by `pomt.frontier.reducer_costs`. The curve's counts and the patched schedules are measured in the
same paired rounds (seeded random order per round, the one model truncated or patched for each visit, as the
offline computation measures and verifies), so that what is compared is the latency model and not the
machine's state minutes apart: on this VM the step between 49 and 50 tokens of deit_tiny at 112 px, batch 16,
read 12% in one minute and 29% in another. Printed per schedule: the predicted and measured speedup and the
error of the predicted latency, both at this run's unpruned median. `--also SCHEDULE ...` adds schedules to the
same rounds (e.g. one a frontier run shipped, `tome:0=2,6=13,7=10,8=6`): whether the model prices it right on a
curve measured beside it tells its own error from the noise of the curve it was chosen on.
Goal (issue 30): |error| <= 3% for multi-block schedules of every reducer.

changes: how the excess grows with the count changes. Layouts whose blocks average about the same count m (about
three quarters of the patch tokens) with 1 to depth - 1 changes, dropped, against the uniform model at m and the
line's check (L(N) + L(2m - N)) / 2 against L(m), in the same paired rounds (CPU only). On the Intel VM (deit_tiny
at 112 px, batch 16, 120 rounds, four runs) one change read +0.4% to +2.8%, eleven +3.7% to +5.7%: the form the
latency model charges (`pomt.frontier.latency`, Mixed counts).

ops: where the curve fails to add up. For each multi-block schedule's token counts (no reducer: the counts
dropped), one forward a round is profiled (torch.profiler, self CPU time per operator) beside the whole
model at each count in the layout, in the same paired rounds. Printed per layout: its profiled excess over
the blocks' sum, sum_b op(L(n_b)) / D for each operator, and the operators that carry it. On the 2-core Intel
VM the counts dropped ran 3.5-6.8% slower than the blocks' sum while the AMD VM read -2.1% to +1.8%; this
part says in which operators the difference lies (CPU only).

Usage: python benchmarks/prediction_error.py [--part multi|ops|changes] [--workloads deit_small:4:224 ...]
       [--also tome:0=2,6=13 ...] [-- extra options]
Tiny check: python benchmarks/prediction_error.py --part multi --workloads deit_tiny:1:64 --rounds 3 \
    --cost-rounds 2 --curve-points 6
On a GPU (multi only): --device cuda --dtype float16 --workloads deit_base:64:224 [--backend cudagraph: the curve,
the reducers' costs and the schedules all timed as CUDA graphs]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pomt.device.allocator import ALLOCATORS
from pomt.errors import PomtError
from pomt.runtimes import DTYPES, IN_PROCESS, check_backend

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


def multi_block_schedules(num_tokens: int, prefix: int, depth: int) -> list:
    """Two- and three-block schedules of every reducer (a share of the patch tokens entering each pruning
    block), ToMe's constant and decreasing r, a front-loaded ToMe schedule, top-k's keep rate at its rate
    blocks."""
    from pomt.frontier.candidates import (
        REDUCERS,
        Candidate,
        rate_blocks,
        tome_constant,
        tome_decreasing,
        tome_values,
        topk_rate,
    )

    layouts = {2: sorted({depth // 3, 2 * depth // 3}), 3: rate_blocks(depth)}
    schedules = []
    for method in REDUCERS:
        for blocks in layouts.values():
            patches, removal = num_tokens - prefix, {}
            for block in blocks:
                removal[block] = max(1, round((0.2 if method == "tome" else 0.25) * patches))
                patches -= removal[block]
            schedules.append(Candidate.of(method, removal))
    values = tome_values(num_tokens, prefix, depth, 5)
    schedules += tome_constant(depth, values[1:2]) + tome_decreasing(depth, values[2:3])
    schedules += topk_rate(num_tokens, prefix, depth, (0.7,))
    # a front-loaded ToMe schedule of the kind the frontier search ships: most merging early, a last merge late
    patches = num_tokens - prefix
    front = {0: patches // 5, 1: patches // 5, 2: patches // 12, 2 * depth // 3: patches // 4}
    schedules.append(Candidate.of("tome", {b: r for b, r in front.items() if r > 0}))
    return list(dict.fromkeys(c for c in schedules if not c.unpruned))


def paired_rounds(model, x, variants: dict, rounds: int, seed: int, threads: int | None,
                  what: str, device: str = "cpu", measure=None, backend: str = "eager") -> dict[str, list]:
    """Per variant, one reading per round: every round visits all variants in a seeded random order, each
    visit entering its context on `model` (a truncation, a patch) and running it in `backend` (eager, or
    captured there as a CUDA graph), one untimed forward, then one measured: its time (ms) by default, or
    `measure(forward)`."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from pomt.measurement.timing import fixed_threads, time_calls
    from pomt.runtimes import build_forward

    rng, names = np.random.default_rng(seed), list(variants)
    readings: dict[str, list] = {name: [] for name in names}
    with fixed_threads(threads) as used, torch.inference_mode():
        for _ in tqdm(range(rounds), desc=what, unit="round", leave=False):
            for i in rng.permutation(len(names)):
                with variants[names[i]](), build_forward(model, x, backend=backend,
                                                          threads=used) as forward:
                    forward()
                    if measure is None:
                        readings[names[i]] += time_calls(forward, device, 1, used)
                    else:
                        readings[names[i]].append(measure(forward))
    return readings


def operator_ms(forward) -> dict[str, float]:
    """Self CPU time (ms) of each operator in one profiled call of `forward` (the profiler's own start and stop
    lines, which its C++ side writes to stderr at every call, are dropped)."""
    import os

    from torch.profiler import ProfilerActivity, profile

    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            forward()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}


def mixed_ops(workload: str, args: argparse.Namespace) -> None:
    """Per multi-block layout (counts dropped, no reducer): its profiled excess over the blocks' sum and the
    operators that carry it."""
    import numpy as np
    import torch

    from pomt.frontier.latency import LatencyModel
    from pomt.models.geometry import model_geometry
    from pomt.models.registry import create_model
    from pomt.models.tokens import dropped_to, truncate_tokens

    model_name, batch, size = workload.split(":")
    net = create_model(model_name, int(size)).eval()
    x = torch.randn(int(batch), 3, int(size), int(size), generator=torch.Generator().manual_seed(args.seed))
    g = model_geometry(net)
    probe = LatencyModel({g.num_tokens: 1.0, g.prefix_tokens + 1: 1.0}, g.num_tokens, g.prefix_tokens, g.depth)
    layouts: dict[tuple[int, ...], list[str]] = {}
    for c in multi_block_schedules(g.num_tokens, g.prefix_tokens, g.depth):
        layouts.setdefault(tuple(probe.counts(c)[:g.depth]), []).append(c.key)
    counts = sorted({n for layout in layouts for n in layout})
    variants = {f"L({n})": (lambda n=n: truncate_tokens(net, n)) for n in counts}
    variants.update({f"drop{layout}": (lambda layout=layout: dropped_to(net, layout)) for layout in layouts})
    readings = paired_rounds(net, x, variants, args.rounds, args.seed + 1, args.threads,
                             "curve and layouts, profiled", measure=operator_ms)
    ops = sorted({op for per_round in readings.values() for reading in per_round for op in reading})
    median = {name: {op: float(np.median([r.get(op, 0.0) for r in per_round])) for op in ops}
              for name, per_round in readings.items()}
    print(f"{workload} (cpu, operators' self time, {args.rounds} paired rounds): {len(counts)} counts, "
          f"{len(layouts)} layouts")
    shares: dict[str, list[float]] = {op: [] for op in ops}
    for layout, keys in layouts.items():
        dropped = median[f"drop{layout}"]
        blocks = {op: sum(median[f"L({n})"][op] for n in layout) / g.depth for op in ops}
        excess = {op: dropped[op] - blocks[op] for op in ops}
        total, expected = sum(dropped.values()), sum(blocks.values())
        for op in ops:
            shares[op].append(excess[op] / expected)
        top = sorted(ops, key=lambda op: -abs(excess[op]))[:4]
        print(f"  {', '.join(keys)}: profiled {total:.3f} ms against the blocks' sum {expected:.3f} ms "
              f"({100 * (total / expected - 1):+.2f}%); by operator: " + ", ".join(
                  f"{op} {excess[op]:+.3f} ms ({100 * excess[op] / max(blocks[op], 1e-9):+.0f}%)" for op in top))
    mean = {op: float(np.mean(v)) for op, v in shares.items()}
    top = sorted(ops, key=lambda op: -abs(mean[op]))[:6]
    print("  mean share of the blocks' sum, over the layouts: " + ", ".join(f"{op} {100 * mean[op]:+.2f}%"
                                                                           for op in top)
          + f"; all operators {100 * sum(mean.values()):+.2f}%")


def equal_mean_layouts(num_tokens: int, prefix: int, depth: int) -> tuple[int, dict[str, tuple[int, ...]]]:
    """A mean count m (about three quarters of the patch tokens) and layouts whose blocks average about m:
    k levels from N down to 2m - N over equal runs of blocks (k - 1 count changes) for k = 2, 3, 6 and depth,
    and one change after block 0."""
    import numpy as np

    mean = prefix + round(0.75 * (num_tokens - prefix))
    layouts = {}
    for k in sorted({2, 3, min(6, depth), depth}):
        levels = np.linspace(num_tokens, 2 * mean - num_tokens, k).round().astype(int)
        runs = np.array_split(np.arange(depth), k)
        layouts[f"{k} levels"] = tuple(int(levels[i]) for i, run in enumerate(runs) for _ in run)
    rest = round((depth * mean - num_tokens) / (depth - 1))
    layouts["one change after block 0"] = (num_tokens, *[rest] * (depth - 1))
    return mean, layouts


def count_changes_excess(workload: str, args: argparse.Namespace) -> None:
    """Layouts of about the same mean count m with 1 to depth - 1 count changes (counts dropped, no reducer)
    against the uniform model at m, in the same paired rounds: how the excess over the blocks' sum grows with
    the changes (the form `pomt.frontier.latency` charges, Mixed counts)."""
    import numpy as np
    import torch

    from pomt.frontier.latency import count_changes
    from pomt.measurement.robust import paired_effect
    from pomt.models.geometry import model_geometry
    from pomt.models.registry import create_model
    from pomt.models.tokens import dropped_to, truncate_tokens

    model_name, batch, size = workload.split(":")
    net = create_model(model_name, int(size)).eval()
    x = torch.randn(int(batch), 3, int(size), int(size), generator=torch.Generator().manual_seed(args.seed))
    g = model_geometry(net)
    mean, layouts = equal_mean_layouts(g.num_tokens, g.prefix_tokens, g.depth)
    low = 2 * mean - g.num_tokens
    variants = {f"L({n})": (lambda n=n: truncate_tokens(net, n)) for n in (g.num_tokens, mean, low)}
    variants.update({name: (lambda layout=layout: dropped_to(net, layout)) for name, layout in layouts.items()})
    times = paired_rounds(net, x, variants, args.rounds, args.seed + 1, args.threads, "layouts, paired")
    at_mean = times[f"L({mean})"]
    ends = np.add(times[f"L({g.num_tokens})"], times[f"L({low})"]) / 2
    line = paired_effect(at_mean, ends)
    print(f"{workload} (cpu, {args.rounds} paired rounds): layouts averaging about {mean} tokens against the "
          f"uniform model at {mean}; linearity: (L({g.num_tokens}) + L({low})) / 2 over L({mean}) "
          f"{100 * (line.ratio - 1):+.2f}% [{100 * (line.ci[0] - 1):+.2f}, {100 * (line.ci[1] - 1):+.2f}]")
    for name, layout in layouts.items():
        effect = paired_effect(at_mean, times[name])
        print(f"  {name:<26s} {count_changes(layout, g.depth):>2d} changes, mean {np.mean(layout):.2f} "
              f"({'-'.join(map(str, layout))}): {100 * (effect.ratio - 1):+.2f}% "
              f"[{100 * (effect.ci[0] - 1):+.2f}, {100 * (effect.ci[1] - 1):+.2f}]")


def multi_block(workload: str, args: argparse.Namespace) -> list[float]:
    """Predicted against measured latency of every multi-block schedule on one workload; the |errors|."""
    from dataclasses import replace

    import numpy as np
    import torch

    from pomt.frontier.candidates import REDUCERS
    from pomt.frontier.latency import LatencyModel
    from pomt.frontier.reducer_costs import COST_ROUNDS, measure_mixed_counts, measure_reducer_costs
    from pomt.measurement.robust import paired_effect
    from pomt.models.geometry import model_geometry
    from pomt.models.registry import create_model
    from pomt.models.tokens import dropped_to, truncate_tokens
    from pomt.patching import patched
    from pomt.runtimes import resolve_dtype
    from pomt.verification.verify import Rounds, TimedModel

    model_name, batch, size = workload.split(":")
    dtype = resolve_dtype(args.dtype, args.device)
    net = create_model(model_name, int(size)).eval().to(args.device, dtype)
    x = torch.randn(int(batch), 3, int(size), int(size), generator=torch.Generator().manual_seed(args.seed))
    x = x.to(args.device, dtype)
    g = model_geometry(net)
    n, prefix, depth = g.num_tokens, g.prefix_tokens, g.depth
    schedules = list(dict.fromkeys([*multi_block_schedules(n, prefix, depth), *args.also]))
    probe = LatencyModel({n: 1.0, prefix + 1: 1.0}, n, prefix, depth)
    lowest = min(min(probe.counts(c)) for c in schedules)
    counts = sorted({*np.linspace(lowest, n, args.curve_points).round().astype(int).tolist(), n})
    start = time.perf_counter()
    timed = TimedModel(net, x, args.device, args.threads, args.backend)
    rounds = COST_ROUNDS if args.cost_rounds is None else args.cost_rounds
    costs = measure_reducer_costs(timed, REDUCERS, Rounds(rounds, seed=args.seed))
    mixed = measure_mixed_counts(timed, Rounds(rounds, seed=args.seed + 2))
    cost_s = time.perf_counter() - start

    layouts = {c.key: tuple(probe.counts(c)[:depth]) for c in schedules}
    variants = {f"L({c})": (lambda c=c: truncate_tokens(net, c)) for c in counts}
    variants.update({c.key: (lambda c=c: patched(net, c.method, c.as_dict())) for c in schedules})
    variants.update({f"drop{kept}": (lambda kept=kept: dropped_to(net, kept)) for kept in set(layouts.values())})
    times = paired_rounds(net, x, variants, args.rounds, args.seed + 1, args.threads,
                          "curve and schedules, paired", args.device, backend=args.backend)
    unpruned_times = times[f"L({n})"]
    unpruned = float(np.median(unpruned_times))
    curve = {c: float(np.median(times[f"L({c})"])) for c in counts}
    latency = LatencyModel(curve, n, prefix, depth, costs, mixed)
    blocks_alone = LatencyModel(curve, n, prefix, depth, mixed=mixed)
    uncorrected = LatencyModel(curve, n, prefix, depth, costs)
    print(f"{workload} ({args.device}, {args.dtype}, {args.backend}, multi-block): reducer costs in {cost_s:.0f} s; "
          f"curve at {len(counts)} counts in [{counts[0]}, {n}] and {len(schedules)} schedules in the same "
          f"{args.rounds} paired rounds, {time.perf_counter() - start - cost_s:.0f} s; unpruned {unpruned:.3f} ms")
    calibration = latency.predict_counts(mixed.layout)
    # as calibrated until 2026-12-01: the layout over the unpruned model against this run's curve (no gate)
    against_curve = mixed.of_unpruned / calibration
    before_model = LatencyModel(curve, n, prefix, depth, costs,
                                replace(mixed, over_blocks=against_curve, ci=(against_curve, against_curve)))
    low, high = (100 * (end - 1) for end in mixed.ci)
    print(f"  mixed counts: the layout {'-'.join(map(str, mixed.layout))} dropped ran "
          f"{100 * (mixed.over_blocks - 1):+.2f}% [{low:+.2f}, {high:+.2f}] over its blocks' sum timed beside it: "
          f"kappa {100 * latency.kappa:+.2f}% per square root of a count change; it "
          f"ran {mixed.of_unpruned:.4f} of the unpruned model, where this run's curve predicts {calibration:.4f} "
          f"(kappa {100 * before_model.kappa:+.2f}% read against it, as before 2026-12-01)")
    errors, inside, before, curve_read = [], 0, [], []
    for c in schedules:
        effect = paired_effect(unpruned_times, times[c.key])
        predicted_ratio = latency.predict(c) / latency.baseline
        reducer_ms = unpruned * (predicted_ratio - blocks_alone.predict(c) / blocks_alone.baseline)
        error = effect.ratio / predicted_ratio - 1
        errors.append(abs(error))
        before.append(abs(effect.ratio / (uncorrected.predict(c) / uncorrected.baseline) - 1))
        curve_read.append(abs(effect.ratio / (before_model.predict(c) / before_model.baseline) - 1))
        inside += effect.ci[0] <= predicted_ratio <= effect.ci[1]
        drop = paired_effect(unpruned_times, times[f"drop{layouts[c.key]}"])
        blocks_error = drop.ratio / (blocks_alone.predict(c) / blocks_alone.baseline) - 1
        mark = "" if abs(error) <= GOAL else "  <- outside the goal"
        print(f"  {c.key:<40s} blocks {len(c.removal):>2d}: predicted {unpruned * predicted_ratio:8.3f} ms "
              f"(speedup {1 / predicted_ratio:.3f}x, reducer {reducer_ms:+.2f} ms), "
              f"measured {unpruned * effect.ratio:8.3f} ms "
              f"(speedup {1 / effect.ratio:.3f}x [{1 / effect.ci[1]:.3f}, {1 / effect.ci[0]:.3f}]), "
              f"error {100 * error:+.2f}%{mark}\n      the same counts dropped (no reducer): measured "
              f"{unpruned * drop.ratio:8.3f} ms, the curve alone predicts it with error {100 * blocks_error:+.2f}%")
    within = sum(e <= GOAL for e in errors)
    print(f"  {within} of {len(errors)} schedules within {100 * GOAL:.0f}% (goal: all); "
          f"largest |error| {100 * max(errors):.2f}%; {inside} of {len(errors)} predictions inside the "
          f"measured speedup's 95% interval")
    print(f"  without the mixed counts' term: {sum(e <= GOAL for e in before)} of {len(before)} within "
          f"{100 * GOAL:.0f}%, largest |error| {100 * max(before):.2f}%")
    print(f"  with kappa read against this run's curve (as before 2026-12-01): {sum(e <= GOAL for e in curve_read)} "
          f"of {len(curve_read)} within {100 * GOAL:.0f}%, largest |error| {100 * max(curve_read):.2f}%")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help="model:batch:input_size")
    parser.add_argument("--part", choices=("single", "multi", "ops", "changes", "both"), default="both",
                        help="single: the offline computation's shipped schedules; multi: multi-block schedules; "
                             "ops: the multi-block layouts' excess over the blocks' sum, by operator (CPU); "
                             "changes: the excess of equal-mean layouts by their count changes (CPU); "
                             "both: single and multi")
    parser.add_argument("--budget", type=float, default=0.9, help="latency budget as a fraction of unpruned")
    # at batch 1 twenty rounds left each measured speedup an interval of +-2-4%, too wide to tell a 3% error
    parser.add_argument("--rounds", type=int, default=60, help="multi, ops: paired rounds (curve and schedules)")
    parser.add_argument("--cost-rounds", type=int, default=None,
                        help="multi: rounds of the reducer-cost measurement (default: the offline computation's)")
    parser.add_argument("--curve-points", type=int, default=24, help="multi: counts at which L(n) is measured")
    parser.add_argument("--threads", type=int, default=None, help="multi, ops: CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="multi: where the model is timed (cuda: CUDA events)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="multi: model and input dtype")
    parser.add_argument("--backend", default="eager", choices=IN_PROCESS,
                        help="multi: the runtime timed (cudagraph: every variant captured as a CUDA graph)")
    parser.add_argument("--allocator", choices=ALLOCATORS, default="steady",
                        help="multi, ops: the host allocator measured under (as the offline computation's --allocator)")
    parser.add_argument("--also", nargs="+", default=[], metavar="SCHEDULE",
                        help="multi: schedules to measure and price beside the others, e.g. tome:0=2,6=13,7=10")
    parser.add_argument("extra", nargs="*", help="further offline_computation.py options (after --)")
    args = parser.parse_args()
    from pomt.cli.app import fail
    from pomt.frontier.candidates import given_schedules
    from pomt.models.registry import geometry_of

    if args.part in ("ops", "changes") and (args.device != "cpu" or args.backend != "eager"):
        fail(f"--part {args.part} measures the CPU only, eager")
    if args.also and args.part not in ("multi", "both"):
        fail("--also adds schedules to --part multi")
    try:
        check_backend(args.backend, args.device)
        # on the meta device, one line before anything is timed
        args.also = given_schedules(args.also, [geometry_of(name, int(size)) for name, _, size in
                                                (w.split(":") for w in args.workloads)] if args.also else [])
    except PomtError as exc:
        fail(str(exc))
    if args.part in ("multi", "ops", "changes", "both"):
        from pomt.device.allocator import allocator_words, use_allocator

        print(f"allocator: {allocator_words(use_allocator(args.allocator))}")
    if args.part in ("ops", "changes"):
        for workload in args.workloads:
            (mixed_ops if args.part == "ops" else count_changes_excess)(workload, args)
        return
    if args.part in ("multi", "both"):
        errors = [e for workload in args.workloads for e in multi_block(workload, args)]
        met = all(e <= GOAL for e in errors)
        print(f"multi-block: largest |error| {100 * max(errors):.2f}% over {len(errors)} schedules "
              f"(goal within {100 * GOAL:.0f}%: {'met' if met else 'NOT met'})\n")
    if args.part in ("single", "both"):
        single(args)


def single(args: argparse.Namespace) -> None:
    """The offline computation's shipped schedule and its verified candidates, per workload."""
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
