"""A measured accuracy as a count of successes out of trials, with its Wilson score interval (pure maths).

Wilson's interval stays inside [0, 1] and keeps its coverage near 0 and 1, where accuracies of good models
and agreements with an unpruned model live; the normal (Wald) interval collapses there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _centre_and_half(p: float, trials: int, z: float) -> tuple[float, float]:
    scale = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / scale
    return centre, z / scale * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))


def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of successes / trials; (0, 1) when there are no trials."""
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    centre, half = _centre_and_half(successes / trials, trials, _z(confidence))
    return max(0.0, centre - half), min(1.0, centre + half)


def half_width(accuracy: float, trials: int, confidence: float = CONFIDENCE) -> float:
    """Half the width of the Wilson interval of `accuracy` measured on `trials` items (decreasing in trials)."""
    return _centre_and_half(accuracy, trials, _z(confidence))[1]


def trials_for_half_width(accuracy: float, width: float, confidence: float = CONFIDENCE) -> int:
    """Fewest trials whose Wilson interval at `accuracy` is at most `width` wide on each side."""
    if width <= 0:
        raise ValueError(f"the half-width must be positive, got {width}")
    low, high = 0, 1
    while half_width(accuracy, high, confidence) > width:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if half_width(accuracy, middle, confidence) <= width else (middle, high)
    return high


@dataclass(frozen=True)
class Proportion:
    """`successes` of `trials` (top-1 hits or agreements), its value and Wilson interval."""

    successes: int
    trials: int

    @property
    def value(self) -> float:
        return self.successes / self.trials if self.trials else math.nan

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        return wilson_interval(self.successes, self.trials, confidence)

    def to_dict(self, confidence: float = CONFIDENCE) -> dict:
        low, high = self.interval(confidence)
        return {"accuracy": round(self.value, 6), "ci": [round(low, 6), round(high, 6)],
                "correct": self.successes, "images": self.trials}


def difference_interval(a: Proportion, b: Proportion, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of a.value - b.value from the two Wilson intervals (Newcombe's hybrid score method); on the
    same images (paired) it errs wide, so a difference it excludes 0 from is there."""
    (a_low, a_high), (b_low, b_high) = a.interval(confidence), b.interval(confidence)
    d = a.value - b.value
    return (d - math.sqrt((a.value - a_low) ** 2 + (b_high - b.value) ** 2),
            d + math.sqrt((a_high - a.value) ** 2 + (b.value - b_low) ** 2))
