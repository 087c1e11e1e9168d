"""Evaluated schedules, their (predicted latency, accuracy) frontier, which may ship, best first, and the best
uniform schedule they must beat (pure). Accuracies are the search split's; drops are in points.

A schedule meets the goal when its drop is within `max_drop_points` and its accuracy at least `min_accuracy` (each
where asked, at `confidence` on one-sided bounds) and its predicted latency within `latency_budget_ms` (where
asked). What may ship is ordered fastest first, or with a latency budget most accurate first; what ships is decided
on measurement (`verified_choice`).
"""

from __future__ import annotations

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


def held_out_drop(point: Evaluated) -> float | None:
    """The point's paired drop on the held-out images it was measured on, in points (None: not measured)."""
    drop = None if point.held_out is None else point.held_out.drop
    return None if drop is None else 100 * drop
