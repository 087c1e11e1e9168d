"""Evaluated schedules, their (predicted latency, accuracy) frontier, and the choices made on it (pure).

Accuracies here are the search split's; drops are in points (percentage points) from the unpruned model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pomt.choice.binomial import Proportion
from pomt.choice.candidates import Candidate
from pomt.errors import PolicyError

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
    """The points no other point beats on both latency and accuracy, fastest first (on equal latency the
    more accurate; on equal both the first given)."""
    front: list[Evaluated] = []
    for point in sorted(points, key=lambda p: (p.predicted_ms, -p.accuracy)):
        if not front or point.accuracy > front[-1].accuracy + EPSILON:
            front.append(point)
    return front


def _accurate_enough(points: Sequence[Evaluated], min_accuracy: float | None) -> list[Evaluated]:
    if min_accuracy is None:
        return list(points)
    kept = [p for p in points if p.accuracy >= min_accuracy - EPSILON]
    if not kept:
        best = max((p.accuracy for p in points), default=float("nan"))
        raise PolicyError(f"no evaluated schedule reaches accuracy {min_accuracy:g}; the best reaches {best:.4g}")
    return kept


def fastest_within_drop(points: Sequence[Evaluated], baseline_accuracy: float, max_drop_points: float,
                        min_accuracy: float | None = None) -> Evaluated:
    """The fastest schedule whose accuracy is at most `max_drop_points` below the unpruned model's (and at
    least `min_accuracy`); on equal latency the more accurate."""
    floor = baseline_accuracy - max_drop_points / 100
    within = [p for p in _accurate_enough(points, min_accuracy) if p.accuracy >= floor - EPSILON]
    if not within:
        raise PolicyError(f"no evaluated schedule is within {max_drop_points:g} points of the unpruned model's "
                          f"accuracy {baseline_accuracy:.4g}")
    return min(within, key=lambda p: (p.predicted_ms, -p.accuracy))


def most_accurate_within(points: Sequence[Evaluated], latency_budget_ms: float,
                         min_accuracy: float | None = None) -> Evaluated:
    """The most accurate schedule whose predicted latency meets the budget (and accuracy the minimum);
    on equal accuracy the faster."""
    within = [p for p in _accurate_enough(points, min_accuracy) if p.predicted_ms <= latency_budget_ms]
    if not within:
        fastest = min((p.predicted_ms for p in points), default=float("nan"))
        raise PolicyError(f"no evaluated schedule meets the latency budget {latency_budget_ms:g} ms; the fastest "
                          f"is predicted at {fastest:.4g} ms")
    return max(within, key=lambda p: (p.accuracy, -p.predicted_ms))
