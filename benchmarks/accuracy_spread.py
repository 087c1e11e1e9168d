"""The accuracy step spread over the ranks of one job, over two runs sharing one accuracy cache, and with its images
decoded once.

--part ranks: a seeded list of candidate schedules counted on every calibration image of the digits case
(`sharded_counts`) by one process and by a torchrun job of --nproc ranks (one thread each, gloo; NCCL on CUDA),
alternated --repeats times; timed around the counting alone (the model, the images and one warm-up batch come first).
Printed: each time, the median speedup of the job over one process with its spread, whether the counts are
byte-identical. Goal: the same counts, bit for bit, and the time close to 1 / --nproc of one process's.
--part cache: two frontier runs of the offline computation standing for two devices (batch 1 and 16, the same weights
and calibration folder) sharing one fresh accuracy cache file. Printed: the second run's accuracy time as a share of
the first's, and the share of its accuracies read from the cache. Goal: at least 70% less accuracy time.
--part held: a calibration of the digits case counting the seeded schedules one to a pass (as a search measures them)
on its search split, with the decoded images read again each pass and held in memory (`pomt.accuracy.HeldBatches`),
alternated --repeats times in one process. Printed: held over read again (median and range), whether the counts are
identical.
Each part saves JSON, CSV and a PNG under --output-dir.
Usage: python benchmarks/accuracy_spread.py --part ranks [--repeats 3] [--candidates 12] [--batch-size 32]
       [--device cuda --nproc N] [--smoke]
       python benchmarks/accuracy_spread.py --part cache [--batch-sizes 1 16] [--max-evals 80] [--threads 2] [--smoke]
       python benchmarks/accuracy_spread.py --part held [--repeats 3] [--candidates 12] [--threads 2] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from frontier import SMOKE_SEARCH
from torch.utils.data import Dataset, Subset
from tqdm import tqdm

from pomt.accuracy import HELD_BYTES, Budget, eval_transform, open_image_folder
from pomt.checks import check_removals
from pomt.cli.app import fail
from pomt.device.fingerprint import resolve_device
from pomt.digits import FRONTIER, SMALL, DigitsCase, Recipe, digits_case
from pomt.errors import PomtError
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.calibration import SEARCH, Calibration, Classifier, model_identity
from pomt.frontier.candidates import Candidate
from pomt.frontier.certify import held_out_size
from pomt.frontier.distributed import Ranks, join_from_env, leave_group, rank_device, sharded_counts
from pomt.frontier.search import MAX_EVALS
from pomt.io import atomic_save_figure, atomic_write_csv, atomic_write_json
from pomt.measurement.search import SearchSettings
from pomt.models.geometry import Geometry, model_geometry
from pomt.offline import OfflineConfig, OfflineResult, run_offline
from pomt.stats import Proportion
from pomt.workload.prepare import Workload

RANKS, CACHE, HELD = "ranks", "cache", "held"
METHODS = ("tome", "topk", "pomt")
RANK_COLUMNS = ("repeat", "ranks", "seconds")
CACHE_COLUMNS = ("run", "batch_size", "accuracy_s", "asked", "measured", "from_cache", "evals")
HELD_COLUMNS = ("repeat", "images", "seconds")
GOAL_SAVING = 0.70  # the second run's accuracy time at most 30% of the first's
SMOKE_DROP = 20.0  # points: what the tiny held-out split of the smoke recipe certifies


def candidate_schedules(geometry: Geometry, count: int, seed: int = 0) -> list[Candidate]:
    """`count` distinct seeded schedules the geometry takes, by turns ToMe, top-k and pomt, each removing at one to
    three blocks at most a quarter of the patch tokens entering the block (at least one)."""
    rng = np.random.default_rng(seed)
    found: dict[Candidate, None] = {}
    while len(found) < count:
        method = METHODS[len(found) % len(METHODS)]
        size = int(rng.integers(1, min(3, geometry.depth) + 1))
        left, removal = geometry.patch_tokens, {}
        for block in sorted(rng.choice(geometry.depth, size=size, replace=False).tolist()):
            removal[block] = int(rng.integers(1, max(1, left // 4) + 1))
            left -= removal[block]
        check_removals(method, removal, geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
        found.setdefault(Candidate.of(method, removal))
    return list(found)


def counts_json(counts: Mapping[Candidate, Proportion]) -> str:
    """The counts as one text: {key: [right, images, lost, gained]}, sorted, for a byte-for-byte comparison."""
    return json.dumps({c.key: [p.successes, p.trials, p.lost, p.gained] for c, p in counts.items()}, sort_keys=True)


@dataclass(frozen=True)
class Counting:
    """The model as counted, the calibration images and the schedules counted on them."""

    classifier: Classifier
    dataset: Dataset
    candidates: tuple[Candidate, ...]


def counting(case: DigitsCase, args: argparse.Namespace) -> Counting:
    """The case's model on this rank's device, its calibration folder through its eval transform, the schedules."""
    device = rank_device(args.device)
    model = case.load().to(device)
    geometry = model_geometry(model)
    dataset, kind = open_image_folder(case.calibration_root, eval_transform(model, geometry.input_size))
    candidates = candidate_schedules(geometry, args.candidates, args.seed)
    return Counting(Classifier(model, kind, device, batch_size=args.batch_size), dataset, tuple(candidates))


def timed_counts(job: Counting, place: Ranks) -> tuple[float, str]:
    """Seconds of one pass of `sharded_counts` over every image by the ranks of `place`, after a warm-up batch each
    rank runs alone, and the counts (`counts_json`)."""
    batch = job.classifier.batch_size
    warm = Subset(job.dataset, range(min(batch, len(job.dataset))))
    sharded_counts(job.classifier, job.candidates, warm, batch, ranks=Ranks())
    if place.size > 1:
        dist.barrier()
    started = time.perf_counter()
    counts = sharded_counts(job.classifier, job.candidates, job.dataset, batch, ranks=place)
    return time.perf_counter() - started, counts_json(counts)


def worker(args: argparse.Namespace) -> None:
    """One rank of the torchrun job: its time and counts to `<--worker>/rank<R>.json`."""
    torch.set_num_threads(args.threads)
    place = join_from_env(args.device)
    try:
        seconds, counts = timed_counts(counting(digits_case(recipe_of(args)), args), place)
    finally:
        leave_group()
    atomic_write_json(Path(args.worker) / f"rank{place.rank}.json", {"seconds": seconds, "counts": counts})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launched(args: argparse.Namespace, folder: Path) -> tuple[float, str]:
    """This script's worker mode as a torchrun job of --nproc ranks: the slowest rank's seconds and the counts, which
    every rank must hold alike."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), __file__, "--part", RANKS, "--worker", str(folder),
               "--device", args.device, "--candidates", str(args.candidates), "--seed", str(args.seed),
               "--batch-size", str(args.batch_size), "--threads", str(args.threads), *(["--smoke"] * args.smoke)]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"the torchrun job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    reports = [json.loads((folder / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(args.nproc)]
    if len({r["counts"] for r in reports}) > 1:
        raise SystemExit("the ranks of one job hold different counts")
    return max(r["seconds"] for r in reports), reports[0]["counts"]


def spread(one: Sequence[float], many: Sequence[float]) -> dict:
    """Speedups of the job over one process, repeat by repeat: their median and range, and the median times."""
    speedups = [a / b for a, b in zip(one, many, strict=True)]
    return {"median_speedup": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
            "speedups": speedups, "one_rank_median_s": statistics.median(one),
            "ranks_median_s": statistics.median(many)}


def bar_chart(path: Path, bars: Mapping[str, Sequence[float]], ylabel: str, title: str) -> Path:
    """A bar per entry at its median, its values as dots over it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.6))
    try:
        names = list(bars)
        axis.bar(names, [statistics.median(v) for v in bars.values()], color="tab:blue", alpha=0.6)
        for x, values in enumerate(bars.values()):
            axis.plot([x] * len(values), values, "o", color="black", markersize=4)
        axis.set_ylabel(ylabel)
        axis.set_title(title, fontsize=9)
        return atomic_save_figure(path, figure)
    finally:
        plt.close(figure)


def run_ranks(args: argparse.Namespace) -> None:
    """One process and the torchrun job alternated (ABBA) --repeats times on the same schedules and images."""
    torch.set_num_threads(args.threads)
    case = digits_case(recipe_of(args), progress=args.progress, device=args.device)
    job = counting(case, args)
    print(f"digits case: {case.recipe.model} at {case.recipe.data.size} px, {len(job.dataset)} calibration images in "
          f"batches of {args.batch_size}; 1 rank against {args.nproc} on {args.device}, {args.threads} thread(s) "
          f"each; {len(job.candidates)} schedules: {' '.join(c.key for c in job.candidates)}")
    times: dict[int, list[float]] = {1: [], args.nproc: []}
    counts: dict[int, set[str]] = {1: set(), args.nproc: set()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="accuracy-ranks-") as scratch:
        for repeat in tqdm(range(args.repeats), "repeats"):
            for size in (1, args.nproc) if repeat % 2 == 0 else (args.nproc, 1):
                seconds, text = timed_counts(job, Ranks()) if size == 1 else launched(args, Path(scratch))
                times[size].append(seconds)
                counts[size].add(text)
                rows.append({"repeat": repeat, "ranks": size, "seconds": round(seconds, 4)})
                tqdm.write(f"  repeat {repeat}: {size} rank{'s' * (size > 1)} {seconds:.3f} s")
    found = spread(times[1], times[args.nproc])
    identical = len(counts[1] | counts[args.nproc]) == 1
    low, high = found["speedup_range"]
    print(f"{args.nproc} ranks over 1: median speedup {found['median_speedup']:.3f}x (range {low:.3f}-{high:.3f} over "
          f"{args.repeats} repeats); median {found['one_rank_median_s']:.3f} s against {found['ranks_median_s']:.3f} s")
    print(f"counts byte-identical between 1 and {args.nproc} ranks: {identical}")
    doc = {"part": RANKS, "model": case.recipe.model, "images": len(job.dataset), "batch_size": args.batch_size,
           "device": args.device, "threads_per_rank": args.threads, "nproc": args.nproc, "repeats": args.repeats,
           "candidates": [c.key for c in job.candidates], "seconds": {str(k): v for k, v in times.items()},
           **found, "counts_identical": identical, "counts": {str(k): sorted(v) for k, v in counts.items()}}
    out = Path(args.output_dir)
    title = (f"{len(job.candidates)} schedules on {len(job.dataset)} images: {args.nproc} ranks "
             f"{found['median_speedup']:.2f}x one (median)")
    for path in (atomic_write_json(out / "ranks.json", doc), atomic_write_csv(out / "ranks.csv", rows, RANK_COLUMNS),
                 bar_chart(out / "ranks.png", {"1 rank": times[1], f"{args.nproc} ranks": times[args.nproc]},
                           "seconds counting (median, repeats)", title)):
        print(f"wrote {path}")


def offline_run(case: DigitsCase, batch: int, cache: Path, args: argparse.Namespace) -> OfflineResult:
    """The offline computation as a user runs it on the case: frontier policy, the whole calibration folder, the
    shared cache file."""
    workload = Workload(model=case.recipe.model, batch_size=batch, input_size=case.recipe.data.size,
                        device=args.device, threads=args.threads, output_dir=Path(args.output_dir) / f"bs{batch}",
                        progress=args.progress)
    config = OfflineConfig(dataset_root=case.calibration_root, checkpoint=case.checkpoint, policy="frontier",
                           max_accuracy_drop=args.drop, max_evals=args.max_evals, accuracy_samples=100_000,
                           accuracy_cache=cache, verify_rounds=3 if args.smoke else OfflineConfig.verify_rounds,
                           verify_seconds=0.0 if args.smoke else OfflineConfig.verify_seconds)
    return run_offline(workload, config, SMOKE_SEARCH if args.smoke else SearchSettings())


def accuracy_row(number: int, result: OfflineResult) -> dict:
    """A run's accuracy time and its accuracies: asked (each schedule on each split it was measured on), measured now
    and read from the cache."""
    found = result.frontier.found
    asked = sum(1 + (e.held_out is not None) for e in found.result.evaluated)
    return {"run": number, "batch_size": result.batch_size, "accuracy_s": found.seconds["accuracy"], "asked": asked,
            "measured": found.measured, "from_cache": asked - found.measured, "evals": found.result.evals}


def run_cache(args: argparse.Namespace) -> None:
    """Two frontier runs, one batch size each, sharing one fresh accuracy cache file."""
    case = digits_case(recipe_of(args), progress=args.progress, device=args.device)
    print(f"digits case: {case.recipe.model} at {case.recipe.data.size} px, {case.calibration_images} calibration "
          f"images; frontier runs at batch {' then '.join(map(str, args.batch_sizes))}, one accuracy cache")
    rows = []
    with tempfile.TemporaryDirectory(prefix="accuracy-cache-") as scratch:
        for number, batch in enumerate(tqdm(args.batch_sizes, "runs"), start=1):
            try:
                rows.append(accuracy_row(number, offline_run(case, batch, Path(scratch) / "accuracy.sqlite", args)))
            except PomtError as exc:
                fail(str(exc))
            r = rows[-1]
            tqdm.write(f"  run {number} (batch {batch}): accuracy {r['accuracy_s']:.2f} s, {r['measured']} of "
                       f"{r['asked']} accuracies measured, {r['from_cache']} read from the cache")
    first, second = rows
    share = second["accuracy_s"] / first["accuracy_s"] if first["accuracy_s"] else float("nan")
    cached = second["from_cache"] / second["asked"] if second["asked"] else float("nan")
    met = share <= 1 - GOAL_SAVING
    print(f"second run's accuracy time: {share:.1%} of the first's ({second['accuracy_s']:.2f} s against "
          f"{first['accuracy_s']:.2f} s); {cached:.1%} of its accuracies read from the cache; goal (at least "
          f"{GOAL_SAVING:.0%} less): {'met' if met else 'not met'}")
    doc = {"part": CACHE, "model": case.recipe.model, "images": case.calibration_images, "drop_points": args.drop,
           "max_evals": args.max_evals, "runs": rows, "time_share": share, "cache_share": cached, "goal_met": met}
    out = Path(args.output_dir)
    bars = {f"run {r['run']}, bs {r['batch_size']}\n{r['measured']}/{r['asked']} measured": [r["accuracy_s"]]
            for r in rows}
    for path in (atomic_write_json(out / "cache.json", doc), atomic_write_csv(out / "cache.csv", rows, CACHE_COLUMNS),
                 bar_chart(out / "cache.png", bars, "accuracy step (s)", f"second run: {share:.0%} of the first's")):
        print(f"wrote {path}")


def timed_passes(job: Counting, budget: int) -> tuple[float, str]:
    """Seconds of counting the schedules one to a pass on the search split of a fresh calibration whose decoded
    images may take `budget` bytes, and the counts (`counts_json`)."""
    calibration = Calibration(job.classifier, job.dataset, AccuracyCache(None, model_identity(job.classifier.model)),
                              held_out=held_out_size(len(job.dataset)) / len(job.dataset))
    calibration.budget = Budget(budget)
    started, counts = time.perf_counter(), {}
    for candidate in job.candidates:
        counts |= calibration.measure([candidate], SEARCH)
    return time.perf_counter() - started, counts_json(counts)


def run_held(args: argparse.Namespace) -> None:
    """Images read again and images held, alternated (ABBA) --repeats times on the same schedules and split."""
    torch.set_num_threads(args.threads or torch.get_num_threads())
    case = digits_case(recipe_of(args), progress=args.progress, device=args.device)
    job = counting(case, args)
    print(f"digits case: {case.recipe.model} at {case.recipe.data.size} px, the search split of {len(job.dataset)} "
          f"calibration images in batches of {args.batch_size}; {len(job.candidates)} schedules one to a pass")
    kinds = {"read again": 0, "held": HELD_BYTES}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    counts, rows = set(), []
    for repeat in tqdm(range(args.repeats), "repeats"):
        for kind in list(kinds)[:: 1 if repeat % 2 == 0 else -1]:
            seconds, text = timed_passes(job, kinds[kind])
            times[kind].append(seconds)
            counts.add(text)
            rows.append({"repeat": repeat, "images": kind, "seconds": round(seconds, 4)})
            tqdm.write(f"  repeat {repeat}: images {kind} {seconds:.3f} s")
    ratios = [h / r for h, r in zip(times["held"], times["read again"], strict=True)]
    median = statistics.median(ratios)
    print(f"held over read again: median {median:.3f} (range {min(ratios):.3f}-{max(ratios):.3f} over {args.repeats} "
          f"repeats); counts identical: {len(counts) == 1}")
    doc = {"part": HELD, "model": case.recipe.model, "images": len(job.dataset), "batch_size": args.batch_size,
           "threads": torch.get_num_threads(), "candidates": [c.key for c in job.candidates],
           "seconds": times, "ratios": ratios, "median_ratio": median, "counts_identical": len(counts) == 1}
    out = Path(args.output_dir)
    for path in (atomic_write_json(out / "held.json", doc), atomic_write_csv(out / "held.csv", rows, HELD_COLUMNS),
                 bar_chart(out / "held.png", times, "seconds counting", f"held: {median:.2f}x the time (median)")):
        print(f"wrote {path}")


def recipe_of(args: argparse.Namespace) -> Recipe:
    """FRONTIER, or SMALL with --smoke."""
    return SMALL if args.smoke else FRONTIER


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=(RANKS, CACHE, HELD), required=True)
    parser.add_argument("--repeats", type=int, default=3, help="ranks, held: runs of each kind, alternated")
    parser.add_argument("--candidates", type=int, default=12, help="ranks, held: seeded schedules counted")
    parser.add_argument("--seed", type=int, default=0, help="ranks: seed of the schedules")
    parser.add_argument("--batch-size", type=int, default=OfflineConfig.accuracy_batch_size,
                        help="ranks: images per forward while counting")
    parser.add_argument("--nproc", type=int, default=2, help="ranks: ranks of the torchrun job")
    parser.add_argument("--batch-sizes", type=int, nargs=2, default=[1, 16], help="cache: the two runs' batch sizes")
    parser.add_argument("--max-evals", type=int, default=MAX_EVALS, help="cache: the offline --max-evals")
    parser.add_argument("--drop", type=float, default=1.0, help="cache: the offline --max-accuracy-drop, points")
    parser.add_argument("--threads", type=int, default=None,
                        help="ranks: threads per rank (default 1); cache: the runs' (default torch's; 1 with --smoke)")
    parser.add_argument("--device", default="cpu", help="where the model trains and is counted (cuda: NCCL ranks)")
    parser.add_argument("--output-dir", default="bin/accuracy-spread")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="the tiny digits recipe in seconds: proves it runs")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a rank of the job: its report's folder
    args = parser.parse_args(argv)
    if min(args.repeats, args.candidates, args.batch_size, args.nproc, args.max_evals, *args.batch_sizes) < 1:
        parser.error("--repeats, --candidates, --batch-size, --nproc, --max-evals and --batch-sizes must be >= 1")
    if args.threads is None and (args.part == RANKS or args.smoke):  # a smoke run shares the machine
        args.threads = 1
    if args.smoke:
        args.repeats, args.batch_size = min(args.repeats, 1), min(args.batch_size, 8)
        args.drop, args.max_evals = max(args.drop, SMOKE_DROP), min(args.max_evals, 26)
    return args


def main() -> None:
    args = parse_args()
    try:
        args.device = resolve_device(args.device)
    except PomtError as exc:
        fail(str(exc))
    if args.worker is not None:
        worker(args)
    elif args.part == RANKS:
        run_ranks(args)
    elif args.part == HELD:
        run_held(args)
    else:
        run_cache(args)


if __name__ == "__main__":
    main()
