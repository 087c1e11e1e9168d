"""Does the shipped schedule keep its accuracy promise on images it was not chosen on? (issue 30)

The frontier search ships the fastest of many schedules whose search-split drop meets the goal, so the one it
ships tends to be the one its split flattered (known weaknesses 18). `--accuracy-confidence` judges the drop on
the upper one-sided bound of its paired interval instead. This replays that choice many times:

1. reads a frontier run's `<stem>.frontier.json` (from `benchmarks/frontier.py`: every schedule its search
   measured, with its predicted latency);
2. measures every one of those schedules on every calibration image of the digits case once
   (`pomt.frontier.calibration.image_outcomes`);
3. splits the images afresh `--splits` times (seeded) into a search and a held-out half, and on each split and
   at each confidence makes pomt's own choice on the search half (`pomt.frontier.choice`: the fastest
   schedule predicted faster than the unpruned model that meets the goal, and the best uniform one), then
   reads its drop on the held-out half.

Printed per confidence: the share of splits whose chosen schedule's held-out drop is within the goal, its mean
held-out drop, its mean predicted speedup, the share whose held-out accuracy lies inside the 95% Wilson interval
of its search-half accuracy (issue 30's goal), and the same for the best uniform schedule (none within the goal:
the unpruned model, 1.00x). The last line is the same interval share for the unpruned model, which nothing
selected: two halves' accuracies differ by about 1.4 times one half's standard error, so even an unselected
schedule's held-out accuracy is expected inside its search interval on only about 83% of splits.
The schedules are those one search measured on its own split: this replays the
choice, not the search, which at a higher confidence would measure other schedules near its boundary; speedups
are predicted, not verified.

Issue 30's goal compares the chosen schedule with the fastest uniform schedule "within the same drop", read two
ways, and both are printed per confidence: the best uniform schedule as the search judges it (the same rule on
the search half, as above), and the fastest uniform schedule whose measured drop on the held-out half is within
the goal (`fastest_held_out_by_family`: picked on the half that judges it, as `benchmarks/frontier.py`'s held-out
line does). `goal met` is the share of splits where the chosen schedule's held-out drop is within the goal and
it is predicted at least `--gain` times that uniform schedule's speed. Given several runs' `frontier.json` (of
one model and batch size), the schedules are all of theirs, each priced at its mean predicted speedup over the
runs that priced it: a ceiling on what any one search among them could ship.
Usage: python benchmarks/held_out_drop.py bin/frontier-bench/bs16/<stem>.frontier.json [more.frontier.json ...]
       [--splits 200] [--drop 1.0] [--gain 1.10] [--confidences 0.5 0.8 0.9 0.95 0.975]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pomt.accuracy import eval_transform, image_loader, open_image_folder, seeded_subset
from pomt.digits import FRONTIER, digits_case
from pomt.frontier.calibration import Classifier, image_outcomes, paired_counts
from pomt.frontier.candidates import FAMILIES, NONE, Candidate
from pomt.frontier.choice import Evaluated, Goal, fastest_held_out_by_family, held_out_drop, held_out_inside, ordered
from pomt.models.geometry import model_geometry
from pomt.stats import Proportion


def measured_schedules(paths: list[Path]) -> list[tuple[Candidate, str, float]]:
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


def choice(points: list[Evaluated], baseline: Evaluated, goal: Goal, uniform: bool) -> Evaluated | None:
    """pomt's choice among the points on one search split: the fastest predicted faster than the unpruned model
    that meets the goal (of the uniform families only, with `uniform`)."""
    pool = [p for p in points if p.predicted_ms < baseline.predicted_ms and (not uniform or p.family in FAMILIES)]
    found = ordered(pool, baseline.accuracy, goal)
    return found[0] if found else None


def with_held(point: Evaluated, held_outcomes: torch.Tensor) -> Evaluated:
    """The point with its accuracy on the held-out half, to be judged as a run judges it (`held_out_drop`,
    `held_out_inside`)."""
    return point.with_held_out(Proportion(int(held_outcomes.sum()), len(held_outcomes)))


def fastest_uniform_held_out(points: list[Evaluated], held: torch.Tensor, outcomes: dict, baseline: Evaluated,
                             drop: float) -> Evaluated:
    """The fastest uniform schedule whose measured drop on the held-out half is within `drop` points, picked on
    that half (`fastest_held_out_by_family`); the unpruned model where none is."""
    uniform = [with_held(p, outcomes[p.candidate][held]) for p in points if p.family in FAMILIES]
    best = fastest_held_out_by_family(uniform, baseline, drop)
    return min(best.values(), key=lambda p: p.predicted_ms, default=baseline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frontier", type=Path, nargs="+",
                        help="<stem>.frontier.json of benchmarks/frontier.py runs (one model and batch size)")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--drop", type=float, default=1.0, help="the goal, points")
    parser.add_argument("--gain", type=float, default=1.10, help="the goal's speedup over the uniform schedule")
    parser.add_argument("--confidences", type=float, nargs="+", default=[0.5, 0.8, 0.9, 0.95, 0.975])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    schedules = measured_schedules(args.frontier)
    case = digits_case(FRONTIER)
    model = case.load()
    dataset, kind = open_image_folder(case.calibration_root, eval_transform(model, model_geometry(model).input_size))
    dataset = seeded_subset(dataset, len(dataset), 0)
    outcomes = image_outcomes(Classifier(model, kind), [c for c, _, _ in schedules],
                              tqdm(image_loader(dataset, 64), "images"))
    images = len(outcomes[NONE])
    runs = args.frontier[0].name if len(args.frontier) == 1 else f"{len(args.frontier)} runs"
    print(f"{len(schedules)} schedules of {runs} on {images} calibration images ({kind}); "
          f"{args.splits} random halves; goal: drop <= {args.drop:g} points, {args.gain:g}x the uniform schedule")
    rng = np.random.default_rng(0)
    found: dict[float, list[tuple[float, ...]]] = {q: [] for q in args.confidences}
    unpruned_inside = []
    for _ in tqdm(range(args.splits), "splits"):
        order = torch.from_numpy(rng.permutation(images))
        search, held = order[: images // 2], order[images // 2:]
        baseline = with_held(Evaluated(NONE, "unpruned", schedules[0][2], paired_counts(
            outcomes[NONE][search], outcomes[NONE][search])), outcomes[NONE][held])
        points = [Evaluated(c, family, ms, paired_counts(outcomes[c][search], outcomes[NONE][search]))
                  for c, family, ms in schedules if not c.unpruned]
        unpruned_inside.append(held_out_inside(baseline))
        held_uniform = fastest_uniform_held_out(points, held, outcomes, baseline, args.drop)
        for q in args.confidences:
            goal = Goal(args.drop, confidence=q)
            picked = [choice(points, baseline, goal, uniform) for uniform in (False, True)]
            judged = [baseline if p is None else with_held(p, outcomes[p.candidate][held]) for p in picked]
            drops = [held_out_drop(p, baseline) for p in judged]
            speeds = [baseline.predicted_ms / p.predicted_ms for p in judged]
            held_in = [held_out_inside(p) for p in judged]
            found[q].append((drops[0], speeds[0], held_in[0], drops[1], speeds[1], held_in[1],
                             baseline.predicted_ms / held_uniform.predicted_ms))
    print(f"{'confidence':>10s} | {'chosen: held-out drop <= goal':>29s} {'mean drop':>9s} {'speedup':>8s} "
          f"{'in interval':>11s} | {'uniform: <= goal':>16s} {'mean drop':>9s} {'speedup':>8s} {'in interval':>11s} "
          "| chosen / uniform, goal met | / uniform held out, goal met")
    for q, rows in found.items():
        a = np.array(rows)
        within = a[:, 0] <= args.drop + 1e-9, a[:, 3] <= args.drop + 1e-9
        same, held_out = a[:, 1] / a[:, 4], a[:, 1] / a[:, 6]
        met = [np.mean(within[0] & (ratio >= args.gain - 1e-9)) for ratio in (same, held_out)]
        print(f"{q:10.3f} | {within[0].mean():29.2f} {a[:, 0].mean():9.2f} {a[:, 1].mean():7.3f}x "
              f"{a[:, 2].mean():11.2f} | "
              f"{within[1].mean():16.2f} {a[:, 3].mean():9.2f} {a[:, 4].mean():7.3f}x {a[:, 5].mean():11.2f} | "
              f"{same.mean():.3f}x, {met[0]:.2f}           | {held_out.mean():.3f}x, {met[1]:.2f}")
    print(f"the unpruned model (nothing selected): held-out accuracy inside its search interval on "
          f"{np.mean(unpruned_inside):.2f} of the splits")
    uniform_held = np.array([row[6] for row in next(iter(found.values()))])
    print(f"the fastest uniform schedule within the goal on the held-out half itself: {uniform_held.mean():.3f}x "
          f"on average ({np.min(uniform_held):.3f}-{np.max(uniform_held):.3f}x)")


if __name__ == "__main__":
    main()
