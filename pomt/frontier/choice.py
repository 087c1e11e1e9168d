"""Evaluated schedules, their (predicted latency, accuracy) frontier, which may ship, best first, and the best
uniform schedule they must beat (pure). Accuracies are the search split's; drops are in points.

A schedule meets the goal when its drop is within `max_drop_points` and its accuracy at least `min_accuracy` (each
where asked, at `confidence` on one-sided bounds) and its predicted latency within `latency_budget_ms` (where
asked). What may ship is ordered fastest first, or with a latency budget most accurate first; what ships is decided
on measurement (`verified_choice`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from pomt.frontier.candidates import FAMILIES, REDUCERS, Candidate
from pomt.stats import CONFIDENCE, Proportion, one_sided_interval

EPSILON = 1e-12


@dataclass(frozen=True)
class Evaluated:
    """One candidate with its predicted latency and its measured accuracy on each split."""

    candidate: Candidate
    family: str
    predicted_ms: float
    search: Proportion
    held_out: Proportion | None = None

    @property
    def accuracy(self) -> float:
        return self.search.value

    def with_held_out(self, held_out: Proportion) -> Evaluated:
        return replace(self, held_out=held_out)

    def to_dict(self) -> dict:
        return {"family": self.family, **self.candidate.to_dict(), "predicted_ms": round(self.predicted_ms, 5),
                "search": self.search.to_dict(), "held_out": None if self.held_out is None else self.held_out.to_dict()}


def pareto_front(points: Sequence[Evaluated]) -> list[Evaluated]:
    """The points no other beats on both latency and accuracy, fastest first (ties: more accurate, then first given)."""
    front: list[Evaluated] = []
    for point in sorted(points, key=lambda p: (p.predicted_ms, -p.accuracy)):
        if not front or point.accuracy > front[-1].accuracy + EPSILON:
            front.append(point)
    return front


def drop_within(point: Evaluated, baseline_accuracy: float, max_drop_points: float, confidence: float) -> bool:
    """Whether the point's search-split drop is within `max_drop_points`: its upper one-sided bound at `confidence`
    where measured paired, else the measured drop (keeps the fastest of many from being the one its split flattered)."""
    bound = point.search.drop_bound(confidence)
    drop = baseline_accuracy - point.accuracy if bound is None else bound
    return drop <= max_drop_points / 100 + EPSILON


def drop_untold(point: Evaluated, baseline_accuracy: float, max_drop_points: float, confidence: float) -> bool:
    """Whether the point is within `max_drop_points` on its measured drop but not on its bound at `confidence`."""
    return drop_within(point, baseline_accuracy, max_drop_points, 0.5) and not drop_within(
        point, baseline_accuracy, max_drop_points, confidence)


def accuracy_at_least(point: Evaluated, min_accuracy: float, confidence: float) -> bool:
    """Whether the point's lower one-sided Wilson bound at `confidence` is at least `min_accuracy`."""
    low = one_sided_interval(point.search.successes, point.search.trials, confidence)[0]
    return low >= min_accuracy - EPSILON


@dataclass(frozen=True)
class FrontierResult:
    """Every evaluated schedule, the unpruned one, the frontier, and how many evaluations were asked."""

    baseline: Evaluated
    evaluated: tuple[Evaluated, ...]
    frontier: tuple[Evaluated, ...]
    evals: int
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"baseline": self.baseline.to_dict(), "evals": self.evals, "notes": list(self.notes),
                "evaluated": [e.to_dict() for e in self.evaluated],
                "frontier": [e.candidate.key for e in self.frontier]}


@dataclass(frozen=True)
class Goal:
    """What the shipped schedule must meet; None: not asked."""

    max_drop_points: float | None = 1.0
    latency_budget_ms: float | None = None
    min_accuracy: float | None = None
    confidence: float = CONFIDENCE

    def meets(self, point: Evaluated, baseline_accuracy: float) -> bool:
        drop = self.max_drop_points
        if drop is not None and not drop_within(point, baseline_accuracy, drop, self.confidence):
            return False
        if self.min_accuracy is not None and not accuracy_at_least(point, self.min_accuracy, self.confidence):
            return False
        return self.latency_budget_ms is None or point.predicted_ms <= self.latency_budget_ms

    def describe(self) -> str:
        """The goal in words, for reasons."""
        drop = self.max_drop_points
        parts = [] if drop is None else [f"within {drop:g} points of the unpruned accuracy"]
        if self.min_accuracy is not None:
            parts.append(f"accuracy at least {self.min_accuracy:g}")
        if parts and self.confidence > 0.5:
            parts[-1] += f" at {self.confidence:.0%} confidence"
        if self.latency_budget_ms is not None:
            parts.append(f"predicted within {self.latency_budget_ms:g} ms")
        return ", ".join(parts) or "any accuracy"


def ordered(points: Iterable[Evaluated], baseline_accuracy: float, goal: Goal) -> list[Evaluated]:
    """The pruned points that meet the goal, best first (see the module docstring)."""
    kept = [p for p in points if not p.candidate.unpruned and goal.meets(p, baseline_accuracy)]
    if goal.latency_budget_ms is not None:
        return sorted(kept, key=lambda p: (-p.accuracy, p.predicted_ms, p.candidate))
    return sorted(kept, key=lambda p: (p.predicted_ms, -p.accuracy, p.candidate))


def preference(result: FrontierResult, goal: Goal) -> list[Evaluated]:
    """The frontier of the schedules predicted faster than unpruned that meet the goal: what may ship, best first."""
    faster = [p for p in result.evaluated if p.predicted_ms < result.baseline.predicted_ms]
    return ordered(pareto_front(ordered(faster, result.baseline.accuracy, goal)), result.baseline.accuracy, goal)


def best_by_family(points: Sequence[Evaluated], baseline_accuracy: float, goal: Goal,
                   families: Sequence[str] = FAMILIES) -> dict[str, Evaluated]:
    """{family: its best schedule that meets the goal} for each family that has one."""
    found = {family: ordered((p for p in points if p.family == family), baseline_accuracy, goal) for family in families}
    return {family: met[0] for family, met in found.items() if met}


def next_faster_missing(points: Sequence[Evaluated], baseline_accuracy: float, goal: Goal,
                        families: Sequence[str] = FAMILIES) -> dict[str, Evaluated]:
    """{family: its next step up (the slowest predicted faster than its best that meets the goal, that misses it)},
    where it has one; with none meeting the goal, faster than the unpruned model."""
    best = best_by_family(points, baseline_accuracy, goal, families)
    unpruned = next((p.predicted_ms for p in points if p.candidate.unpruned), math.inf)
    found = {}
    for family in families:
        ceiling = best[family].predicted_ms if family in best else unpruned
        missing = [p for p in points if p.family == family and p.predicted_ms < ceiling
                   and not goal.meets(p, baseline_accuracy)]
        if missing:
            found[family] = max(missing, key=lambda p: (p.predicted_ms, p.candidate))
    return found


def next_step_note(family: str, point: Evaluated, baseline_ms: float, confidence: float) -> str:
    """`point`, a family's next step up (`next_faster_missing`), in words, its drop's bound at `confidence`."""
    search = point.search
    told = "unpaired" if not search.paired else (
        f"drop {100 * search.drop:+.2f} points ({search.lost} lost, {search.gained} gained of {search.trials}), "
        f"bound {100 * search.drop_bound(confidence):.2f}")
    return (f"{family}'s next step up misses the goal: {point.candidate.key} (predicted "
            f"{baseline_ms / point.predicted_ms:.3f}x), search split {told}")


def best_uniform(result: FrontierResult, goal: Goal) -> Evaluated | None:
    """The best schedule of any uniform family that meets the goal (None: none does): the one to beat."""
    found = ordered((p for p in result.evaluated if p.family in FAMILIES), result.baseline.accuracy, goal)
    return found[0] if found else None


def to_verify(result: FrontierResult, goal: Goal, first: int) -> list[Evaluated]:
    """The schedules verified, in the order of fallback: the first `first` of `preference`, each missing reducer's
    fastest that meets the goal (one the latency model misprices is measured), then the best uniform schedule."""
    chosen = preference(result, goal)[:first]
    faster = [p for p in result.evaluated if not p.candidate.unpruned and p.predicted_ms < result.baseline.predicted_ms]
    for method in REDUCERS:
        if not any(p.candidate.method == method for p in chosen):
            chosen += ordered((p for p in faster if p.candidate.method == method), result.baseline.accuracy, goal)[:1]
    uniform = best_uniform(result, goal)
    return chosen + ([uniform] if uniform is not None and uniform not in chosen else [])


def first_verified(order: Sequence[int], qualified_here: Iterable[int],
                   held_fresh: Iterable[int] | None = None) -> int | None:
    """The first of `qualified_in_both`; None when none qualified."""
    return next(iter(qualified_in_both(order, qualified_here, held_fresh)), None)


def qualified_in_both(order: Sequence[int], qualified_here: Iterable[int],
                      held_fresh: Iterable[int] | None) -> list[int]:
    """The candidates, in order, that qualified here and, where a fresh process measured them, there too."""
    here = set(qualified_here)
    fresh = None if held_fresh is None else set(held_fresh)
    return [i for i in order if i in here and (fresh is None or i in fresh)]


def verified_choice(order: Sequence[int], speedups: Mapping[int, float], qualified_here: Iterable[int],
                    held_fresh: Iterable[int] | None, goal: Goal) -> int | None:
    """What ships among the verified candidates (numbered in the order of preference) that qualified in both
    processes: the fastest measured, or with only a latency budget the first in the order; None when none did."""
    if goal.latency_budget_ms is not None and goal.max_drop_points is None:
        return first_verified(order, qualified_here, held_fresh)
    eligible = qualified_in_both(order, qualified_here, held_fresh)
    return max(eligible, key=lambda i: (speedups[i], -order.index(i)), default=None)


@dataclass(frozen=True)
class Unresolved:
    """Schedules the search split could not tell, fastest first, each with the search images that would bound its
    drop within the goal at the same rates (None: more than a million)."""

    schedules: tuple[tuple[Evaluated, int | None], ...]

    @property
    def fastest(self) -> tuple[Evaluated, int | None]:
        return self.schedules[0]

    @property
    def fewest_images(self) -> tuple[Evaluated, int | None]:
        """The one the fewest images would tell (on a tie the faster)."""
        return min(self.schedules, key=lambda s: math.inf if s[1] is None else s[1])

    def to_dict(self, baseline: Evaluated, confidence: float) -> dict:
        """As the schedule's and the frontier file's `unresolved` object (drops in points)."""
        return {"schedules": len(self.schedules), "fastest": told(*self.fastest, baseline, confidence),
                "fewest_images": told(*self.fewest_images, baseline, confidence)}


def told(point: Evaluated, images: int | None, baseline: Evaluated, confidence: float) -> dict:
    """What `Unresolved` says of one schedule (drops in points)."""
    search = point.search
    return {"key": point.candidate.key, "predicted_speedup": round(baseline.predicted_ms / point.predicted_ms, 4),
            "search_drop_points": round(100 * search.drop, 3),
            "search_drop_bound_points": round(100 * search.drop_bound(confidence), 3),
            "search_changed": search.lost + search.gained, "search_images": search.trials,
            "search_images_to_bound": images}


def unresolved(result: FrontierResult, goal: Goal) -> Unresolved | None:
    """What `Unresolved` holds: predicted faster than the fastest that met the goal and `drop_untold` (None: none)."""
    if goal.max_drop_points is None or goal.min_accuracy is not None or goal.latency_budget_ms is not None \
            or goal.confidence <= 0.5:
        return None
    met = ordered(result.evaluated, result.baseline.accuracy, goal)
    faster_than = met[0].predicted_ms if met else result.baseline.predicted_ms
    found = sorted((p for p in result.evaluated if not p.candidate.unpruned and p.predicted_ms < faster_than
                    and drop_untold(p, result.baseline.accuracy, goal.max_drop_points, goal.confidence)),
                   key=lambda p: (p.predicted_ms, p.candidate))
    if not found:
        return None
    return Unresolved(tuple((p, p.search.images_to_bound(goal.max_drop_points / 100, goal.confidence)) for p in found))


def bound_text(bound_points: float, goal_points: float) -> str:
    """A drop bound in points as a note prints it: two decimals, or "just over" the goal where those read as it."""
    text = f"{bound_points:.2f}"
    return f"just over {goal_points:g}" if float(text) <= goal_points < bound_points else text


def unresolved_note(found: Unresolved | None, baseline: Evaluated, goal: Goal,
                    held_out_share: float) -> tuple[str, ...]:
    """The run's note on what `unresolved` found (the `--accuracy-samples` at `held_out_share`); none: no note."""
    if found is None:
        return ()

    def said(point: Evaluated, images: int | None) -> str:
        facts = told(point, images, baseline, goal.confidence)
        text = (f"{facts['key']} (predicted {facts['predicted_speedup']:.2f}x, drop {100 * point.search.drop:+.2f} "
                f"points, {facts['search_changed']} of {facts['search_images']} images changed, bound "
                f"{bound_text(100 * point.search.drop_bound(goal.confidence), goal.max_drop_points)}) ")
        if images is None:
            return text + "would need more than a million search images at the same rates"
        return (text + f"would be bounded within {goal.max_drop_points:g} points on about {images} search images at "
                       f"the same rates (--accuracy-samples {math.ceil(images / (1 - held_out_share))} at this "
                       "held-out share)")

    count = len(found.schedules)
    text = (f"{count} schedule{'s' if count > 1 else ''} predicted faster than the fastest that met the goal "
            f"{'meet' if count > 1 else 'meets'} it on the measured drop, not on its bound at {goal.confidence:.0%}: "
            f"too few search images to tell. The fastest, {said(*found.fastest)}")
    if found.fewest_images[0] != found.fastest[0]:
        text += f"; the one the fewest would tell, {said(*found.fewest_images)}"
    return (text,)


def held_out_inside(point: Evaluated) -> bool | None:
    """Whether the held-out accuracy lies inside the search split's 95% Wilson interval (None: not measured)."""
    if point.held_out is None:
        return None
    low, high = point.search.interval()
    return low - 1e-12 <= point.held_out.value <= high + 1e-12


def held_out_drop(point: Evaluated, baseline: Evaluated) -> float | None:
    """The point's held-out drop from the unpruned model's held-out accuracy, in points (None: not measured)."""
    if point.held_out is None or baseline.held_out is None:
        return None
    return 100 * (baseline.held_out.value - point.held_out.value)


def fastest_held_out_by_family(points: Sequence[Evaluated], baseline: Evaluated, max_drop_points: float,
                               families: Sequence[str] = FAMILIES) -> dict[str, Evaluated]:
    """{family: its fastest predicted schedule whose held-out drop is at most `max_drop_points`}, where it has one."""
    within = {family: [p for p in points if p.family == family and (drop := held_out_drop(p, baseline)) is not None
                       and drop <= max_drop_points] for family in families}
    return {family: min(ps, key=lambda p: (p.predicted_ms, p.candidate)) for family, ps in within.items() if ps}


def held_out_note(chosen: Evaluated | None, baseline: Evaluated, goal: Goal) -> str | None:
    """A note where the shipped schedule's held-out accuracy lies outside its search interval or drops beyond the
    goal (the fastest of many that met it is the one the search split flattered most); None otherwise."""
    if chosen is None or chosen.candidate.unpruned or chosen.held_out is None:
        return None
    drop, inside = held_out_drop(chosen, baseline), held_out_inside(chosen)
    over = goal.max_drop_points is not None and drop is not None and drop > goal.max_drop_points + 1e-9
    if inside and not over:
        return None
    low, high = chosen.search.interval()
    said = [] if inside else [f"its accuracy {chosen.held_out.value:.3f} lies outside its search-split interval "
                              f"[{low:.3f}, {high:.3f}]"]
    if over:
        said.append(f"its drop of {drop:.2f} points exceeds the goal of {goal.max_drop_points:g}")
    return ("held out, " + " and ".join(said) + ": the search split flattered the fastest schedule that met the "
            "goal there; more calibration images (--accuracy-samples) or a higher --accuracy-confidence make "
            "this rarer")
