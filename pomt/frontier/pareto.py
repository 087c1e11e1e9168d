"""Evaluated schedules, their (predicted latency, accuracy) frontier, and whether one meets an accuracy goal
(pure).

Accuracies here are the search split's; drops are in points (percentage points) from the unpruned model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pomt.frontier.candidates import Candidate
from pomt.stats import Proportion, one_sided_interval

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


def drop_within(point: Evaluated, baseline_accuracy: float, max_drop_points: float, confidence: float) -> bool:
    """Whether the point's search-split drop from the unpruned model is within `max_drop_points`: its upper
    one-sided bound at `confidence` where it was measured paired (`Proportion.drop_bound`), else the
    measured drop. At 0.5 both are the measured drop; above, a schedule that changed many images needs a
    smaller measured drop, which is what keeps the fastest of many from being the one its split flattered."""
    bound = point.search.drop_bound(confidence)
    drop = baseline_accuracy - point.accuracy if bound is None else bound
    return drop <= max_drop_points / 100 + EPSILON


def drop_untold(point: Evaluated, baseline_accuracy: float, max_drop_points: float, confidence: float) -> bool:
    """Whether the images were too few to tell if the point is within `max_drop_points`: within it on its
    measured drop (`drop_within` at 0.5), not on its bound at `confidence`."""
    return drop_within(point, baseline_accuracy, max_drop_points, 0.5) and \
        not drop_within(point, baseline_accuracy, max_drop_points, confidence)


def accuracy_at_least(point: Evaluated, min_accuracy: float, confidence: float) -> bool:
    """Whether the point's search-split accuracy is at least `min_accuracy`, on its lower one-sided Wilson
    bound at `confidence`."""
    low = one_sided_interval(point.search.successes, point.search.trials, confidence)[0]
    return low >= min_accuracy - EPSILON
