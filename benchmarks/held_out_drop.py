"""Does the schedule the frontier ships keep its accuracy promise on images nothing chose it on?

Every schedule a frontier run measured (`<stem>.frontier.json`, from `benchmarks/frontier.py`) is measured once on
every calibration image of the case (`--case`, digits by default). Each seeded split then halves the images into A
and B and replays pomt's selection on A: a `held_out_size` part of A certifies, the rest is the search split; the
`finalists` are picked on the search part's paired counts and certified batch by batch on the other part by the
`Certifier`; the fastest predicted certified finalist ships (none: the unpruned model). Its paired drop on B says
whether the promise held: the share of splits within the goal should be at least the confidence (a schedule whose
true drop sits at the goal reads beyond it on B about half the time, so the share understates the promise). Speedups
are predicted; several runs' files pool their schedules, each at its mean predicted share of the unpruned latency.
Writes `<stem>.held-out-drop.csv` (a row per split), `.json` (the summary) and `.png` (the shipped drops on B).
Usage: python benchmarks/held_out_drop.py bin/frontier-bench/bs16/<stem>.frontier.json [more.frontier.json ...]
       [--case digits|crops] [--splits 200] [--drop 1.0] [--gain 1.10] [--confidences 0.95] [--finalists 4]
       [--accuracy-batch-size 32] [--output DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pomt.accuracy import eval_transform, image_loader, open_image_folder, seeded_subset
from pomt.frontier.calibration import Classifier, image_outcomes, paired_counts
from pomt.frontier.candidates import NONE, Candidate
from pomt.frontier.certify import (
    FINALISTS,
    Certification,
    Certifier,
    certified_uniform,
    finalists,
    held_out_size,
    images_to_certify_unchanged,
)
from pomt.frontier.choice import Evaluated, FrontierResult, Goal
from pomt.io import atomic_save_figure, atomic_write_csv, atomic_write_json
from pomt.models.geometry import model_geometry
from pomt.stats import Proportion

Schedule = tuple[Candidate, str, float]  # a schedule, its family, its predicted share of the unpruned latency
COLUMNS = ("split", "confidence", "finalists_asked", "search_images", "held_out_images", "fresh_images", "finalists",
           "certified", "shipped", "shipped_family", "shipped_speedup", "shipped_drop", "shipped_within", "uniform",
           "uniform_speedup", "uniform_drop", "uniform_within", "shipped_over_uniform")
EPSILON = 1e-9


def measured_schedules(paths: list[Path]) -> list[Schedule]:
    """(candidate, family, predicted latency as a share of the unpruned model's) of every schedule the frontier
    runs measured, the unpruned model first: each schedule's share is its mean over the runs that priced it, its
    family the first run's that measured it."""
    shares: dict[Candidate, list[float]] = {NONE: [1.0]}
    families = {NONE: "unpruned"}
    for path in paths:
        rows = json.loads(path.read_text(encoding="utf-8"))["schedules"]
        unpruned = next(row["predicted_ms"] for row in rows if row["key"] == NONE.key)
        for row in rows:
            candidate = Candidate.parse(row["key"])
            if not candidate.unpruned:
                shares.setdefault(candidate, []).append(row["predicted_ms"] / unpruned)
                families.setdefault(candidate, row["family"])
    return [(c, families[c], float(np.mean(share))) for c, share in shares.items()]


@dataclass(frozen=True)
class Measured:
    """Every schedule (the unpruned model first) with whether its top-1 is right on each calibration image; the
    points it makes hold the predicted share of the unpruned latency as `predicted_ms`."""

    schedules: tuple[Schedule, ...]
    right: Mapping[Candidate, torch.Tensor]

    @property
    def images(self) -> int:
        return len(self.right[NONE])

    def counts(self, candidate: Candidate, images: torch.Tensor) -> Proportion:
        """The candidate's paired counts against the unpruned model on `images` (indices, in order)."""
        return paired_counts(self.right[candidate][images], self.right[NONE][images])

    def search_result(self, search: torch.Tensor) -> FrontierResult:
        """Every schedule with its search-split counts, as `finalists` reads a search's result."""
        points = tuple(Evaluated(c, family, share, self.counts(c, search)) for c, family, share in self.schedules)
        return FrontierResult(points[0], points, (), len(points))


@dataclass(frozen=True)
class Split:
    """Image indices of one replay: half A's search and held-out parts, and half B (fresh)."""

    search: torch.Tensor
    held_out: torch.Tensor
    fresh: torch.Tensor


def halves(images: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded order of the images cut into half A and half B."""
    order = torch.from_numpy(rng.permutation(images))
    return order[: images // 2], order[images // 2:]


def split_of(a: torch.Tensor, b: torch.Tensor) -> Split:
    """Half A's first `held_out_size` images (in its seeded order) held out to certify, the rest searched."""
    held = held_out_size(len(a))
    return Split(a[held:], a[:held], b)


def certification_count(measured: Measured, candidate: Candidate, held_out: torch.Tensor,
                        certifier: Certifier) -> Proportion:
    """The candidate's held-out count as certification measures it: batch by batch in the held-out order, stopped
    after the first batch the certifier stops on."""
    size = certifier.batch_size
    for end in [*range(size, len(held_out), size), len(held_out)]:
        count = measured.counts(candidate, held_out[:end])
        if certifier(count):
            break
    return count


def certify(measured: Measured, split: Split, goal: Goal, count: int, batch_size: int) -> tuple[Evaluated,
                                                                                               Certification]:
    """The unpruned model on the search part, and at most `count` finalists picked there and certified on the
    held-out part (as `pomt.frontier.certify.certified` does)."""
    result = measured.search_result(split.search)
    chosen = finalists(result, goal, len(split.held_out), count)
    certifier = Certifier(max(1, len(chosen)), len(split.held_out), batch_size, goal.max_drop_points / 100,
                          goal.confidence)
    judged = tuple(p.with_held_out(certification_count(measured, p.candidate, split.held_out, certifier))
                   for p in chosen)
    return result.baseline, Certification(certifier, judged)


def picks(baseline: Evaluated, certification: Certification) -> tuple[Evaluated, Evaluated]:
    """What ships (the fastest predicted certified finalist) and the fastest certified uniform finalist; the
    unpruned model where none is."""
    shipped = min(certification.certified, key=lambda p: (p.predicted_ms, p.candidate), default=baseline)
    return shipped, certified_uniform(certification) or baseline


def replay(measured: Measured, split: Split, goal: Goal, count: int, batch_size: int) -> dict:
    """One split's row: the selection replayed on half A, the shipped and uniform picks read on half B."""
    baseline, certification = certify(measured, split, goal, count, batch_size)
    shipped, uniform = picks(baseline, certification)
    row = {"confidence": goal.confidence, "finalists_asked": count, "search_images": len(split.search),
           "held_out_images": len(split.held_out), "fresh_images": len(split.fresh),
           "finalists": len(certification.finalists), "certified": len(certification.certified)}
    for name, point in (("shipped", shipped), ("uniform", uniform)):
        drop = 100 * measured.counts(point.candidate, split.fresh).drop
        row |= {name: point.candidate.key, f"{name}_speedup": round(1 / point.predicted_ms, 5),
                f"{name}_drop": round(drop, 5), f"{name}_within": drop <= goal.max_drop_points + EPSILON}
    row["shipped_family"] = shipped.family
    row["shipped_over_uniform"] = round(uniform.predicted_ms / shipped.predicted_ms, 5)
    return row


def replay_splits(measured: Measured, splits: int, goals: Sequence[Goal], counts: Sequence[int], batch_size: int,
                  seed: int = 0) -> list[dict]:
    """Rows of `splits` seeded splits, each replayed at every goal and finalist count on the same halves."""
    rng = np.random.default_rng(seed)
    rows = []
    for number in tqdm(range(splits), "splits"):
        a, b = halves(measured.images, rng)
        for goal in goals:
            for count in counts:
                rows.append({"split": number} | replay(measured, split_of(a, b), goal, count, batch_size))
    return rows


def summary(rows: Sequence[dict], drop: float, gain: float) -> dict:
    """What the splits of one confidence and finalist count found: `promise` is the share whose shipped drop on
    half B is within the goal (to be at least the confidence)."""
    within = np.array([r["shipped_within"] for r in rows], dtype=bool)
    pruned = np.array([r["shipped"] != NONE.key for r in rows], dtype=bool)
    held = rows[0]["held_out_images"]
    needed = images_to_certify_unchanged(drop / 100, rows[0]["confidence"], rows[0]["finalists_asked"])
    return {"confidence": rows[0]["confidence"], "finalists": rows[0]["finalists_asked"], "splits": len(rows),
            "promise": float(within.mean()),
            "promise_when_pruned": float(within[pruned].mean()) if pruned.any() else None,
            "mean_drop": float(np.mean([r["shipped_drop"] for r in rows])),
            "none_certified": float(np.mean([r["certified"] == 0 for r in rows])),
            "shipped_speedup": float(np.mean([r["shipped_speedup"] for r in rows])),
            "uniform_speedup": float(np.mean([r["uniform_speedup"] for r in rows])),
            "gain_met": float(np.mean([r["shipped_over_uniform"] >= gain - EPSILON for r in rows])),
            "uniform_promise": float(np.mean([r["uniform_within"] for r in rows])),
            "held_out_images": held, "unchanged_needs": needed}


def summaries(rows: Iterable[dict], drop: float, gain: float) -> list[dict]:
    """A `summary` per (confidence, finalist count), in the order the rows first name them."""
    groups: dict[tuple[float, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["confidence"], row["finalists_asked"]), []).append(row)
    return [summary(group, drop, gain) for group in groups.values()]


def report(found: Sequence[dict], gain: float) -> list[str]:
    """The summaries as a table, and a line for each held-out part too small to certify anything."""
    lines = [f"{'confidence':>10s} {'finalists':>9s} | {'promise':>7s} {'if pruned':>9s} {'mean drop':>9s} "
             f"{'none certified':>14s} {'shipped':>8s} {'uniform':>8s} {f'>= {gain:g}x':>8s} | "
             f"{'uniform promise':>15s}"]
    for s in found:
        pruned = "-" if s["promise_when_pruned"] is None else f"{s['promise_when_pruned']:.3f}"
        mark = "" if s["promise"] >= s["confidence"] - EPSILON else "  (below the confidence)"
        lines.append(f"{s['confidence']:10.3f} {s['finalists']:9d} | {s['promise']:7.3f} {pruned:>9s} "
                     f"{s['mean_drop']:9.3f} {s['none_certified']:14.3f} {s['shipped_speedup']:7.3f}x "
                     f"{s['uniform_speedup']:7.3f}x {s['gain_met']:8.3f} | {s['uniform_promise']:15.3f}{mark}")
    for s in found:
        if s["held_out_images"] < s["unchanged_needs"]:
            lines.append(f"at {s['confidence']:g} the {s['held_out_images']} held-out images cannot certify even an "
                         f"unchanged schedule among {s['finalists']} finalists (that takes {s['unchanged_needs']}): "
                         "fewer are certified, each at a larger share of the error, or none")
    return lines


def plot_drops(path: Path, rows: Sequence[dict], drop: float) -> Path:
    """A histogram of the shipped schedule's drop on half B per (confidence, finalist count), the goal drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    try:
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(f"{r['confidence']:g}, {r['finalists_asked']} finalists", []).append(r["shipped_drop"])
        values = np.concatenate([np.array(v) for v in groups.values()])
        bins = np.linspace(min(values.min(), -drop), max(values.max(), 2 * drop), 41)
        for label, drops in groups.items():
            axis.hist(drops, bins=bins, alpha=0.5, label=label)
        axis.axvline(drop, color="black", linestyle="--", label=f"goal: {drop:g} points")
        axis.set_xlabel("shipped schedule's paired drop on half B (points)")
        axis.set_ylabel("splits")
        axis.legend()
        return atomic_save_figure(path, figure)
    finally:
        plt.close(figure)


def write_outputs(folder: Path, stem: str, rows: Sequence[dict], found: Sequence[dict], drop: float) -> list[Path]:
    """`<stem>.held-out-drop.csv` (a row per split), `.json` (the summaries) and `.png` in `folder`."""
    base = folder / f"{stem}.held-out-drop"
    return [atomic_write_csv(f"{base}.csv", rows, COLUMNS),
            atomic_write_json(f"{base}.json", {"drop_points": drop, "summaries": list(found)}),
            plot_drops(Path(f"{base}.png"), rows, drop)]


def measure(schedules: Sequence[Schedule], case_name: str = "digits") -> Measured:
    """Every schedule measured on every calibration image of the case (`pomt.digits` or `pomt.crops`, its trained
    model)."""
    module = importlib.import_module(f"pomt.{case_name}")
    case = getattr(module, f"{case_name}_case")(module.FRONTIER)
    model = case.load()
    dataset, kind = open_image_folder(case.calibration_root, eval_transform(model, model_geometry(model).input_size))
    dataset = seeded_subset(dataset, len(dataset), 0)
    right = image_outcomes(Classifier(model, kind), [c for c, _, _ in schedules],
                           tqdm(image_loader(dataset, 64), "images"))
    return Measured(tuple(schedules), right)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frontier", type=Path, nargs="+",
                        help="<stem>.frontier.json of benchmarks/frontier.py runs (one model and batch size)")
    parser.add_argument("--case", choices=("digits", "crops"), default="digits",
                        help="the real-data case the frontier runs were of (pomt.digits, pomt.crops)")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--drop", type=float, default=1.0, help="the goal, points")
    parser.add_argument("--gain", type=float, default=1.10, help="the shipped schedule's speedup over the uniform one")
    parser.add_argument("--confidences", type=float, nargs="+", default=[0.95])
    parser.add_argument("--finalists", type=int, nargs="+", default=[FINALISTS])
    parser.add_argument("--accuracy-batch-size", type=int, default=32, help="the run's images per certifying batch")
    parser.add_argument("--output", type=Path, default=None, help="folder of the results (default: the first input's)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.splits < 1 or args.accuracy_batch_size < 1 or min(args.finalists) < 1:
        parser.error("--splits, --accuracy-batch-size and --finalists must be at least 1")
    torch.set_num_threads(args.threads)
    schedules = measured_schedules(args.frontier)
    measured = measure(schedules, args.case)
    runs = args.frontier[0].name if len(args.frontier) == 1 else f"{len(args.frontier)} runs"
    print(f"{len(schedules)} schedules of {runs} on {measured.images} calibration images; {args.splits} seeded "
          f"splits into halves A (searched and certified) and B (fresh); goal: drop <= {args.drop:g} points, "
          f"{args.gain:g}x the fastest certified uniform schedule")
    goals = [Goal(args.drop, confidence=q) for q in args.confidences]
    rows = replay_splits(measured, args.splits, goals, args.finalists, args.accuracy_batch_size)
    found = summaries(rows, args.drop, args.gain)
    print("\n".join(report(found, args.gain)))
    stem = args.frontier[0].name.removesuffix(".json").removesuffix(".frontier")
    for path in write_outputs(args.output or args.frontier[0].parent, stem, rows, found, args.drop):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
