"""A measured accuracy as a count of successes out of trials, with its Wilson score interval (pure maths).

Wilson's interval stays inside [0, 1] and keeps its coverage near 0 and 1, where accuracies of good models live.
A schedule's drop is measured paired, on the same images as the unpruned model, so the bound on the drop combines
the two Wilson intervals with the correlation of the paired outcomes: Newcombe's method 10 (Statistics in Medicine
17, 1998). With agreement there is nothing to correlate: the bound is one minus the agreement's lower bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95


def z_score(confidence: float) -> float:
    """The standard normal quantile a two-sided interval at `confidence` spans on each side."""
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
    share = successes / trials
    centre, half = _centre_and_half(share, trials, z_score(confidence))
    # the interval holds the share; rounding put all-right's upper end an ulp below 1 for about half of all n
    return max(0.0, min(share, centre - half)), min(1.0, max(share, centre + half))


def one_sided_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """The lower and the upper one-sided Wilson bounds at `confidence`; at 0.5 both are the measured share."""
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"a one-sided confidence must lie in [0.5, 1), got {confidence}")
    if confidence == 0.5 and trials:
        return successes / trials, successes / trials
    return wilson_interval(successes, trials, 2 * confidence - 1)


def paired_drop_bound(correct: int, lost: int, gained: int, images: int, confidence: float) -> float:
    """Upper one-sided bound at `confidence` of the drop (lost - gained) / images of a schedule that got `correct`
    right, `lost` that the unpruned model got right and it did not, `gained` the other way (Newcombe's method 10)."""
    base = correct + lost - gained  # what the unpruned model got right
    both_wrong = images - correct - lost
    if min(lost, gained, both_wrong, correct - gained) < 0:
        raise ValueError(f"not a paired table: {correct} right, {lost} lost, {gained} gained of {images}")
    if not images:
        return 1.0
    both_right = correct - gained
    p_base, p_schedule = base / images, correct / images
    _, base_high = one_sided_interval(base, images, confidence)
    schedule_low, _ = one_sided_interval(correct, images, confidence)
    margins = base * (images - base) * correct * (images - correct)
    phi = (both_right * both_wrong - lost * gained) / math.sqrt(margins) if margins else 0.0
    over, under = base_high - p_base, p_schedule - schedule_low
    return p_base - p_schedule + math.sqrt(max(0.0, over * over - 2 * phi * over * under + under * under))


def paired_difference_interval(a_correct: int, b_correct: int, a_only: int, b_only: int, images: int,
                               confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided interval at `confidence` of a's accuracy minus b's on the same `images` (`a_only` right for a
    alone, `b_only` for b alone); each end is the one-sided paired bound at (1 + confidence) / 2."""
    one_sided = (1.0 + confidence) / 2.0
    high = paired_drop_bound(b_correct, a_only, b_only, images, one_sided)  # a - b, b in the schedule's place
    low = -paired_drop_bound(a_correct, b_only, a_only, images, one_sided)
    return low, high


def half_width(accuracy: float, trials: int, confidence: float = CONFIDENCE) -> float:
    """Half the width of the Wilson interval of `accuracy` measured on `trials` items (decreasing in trials)."""
    return _centre_and_half(accuracy, trials, z_score(confidence))[1]


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
    """`successes` of `trials`, its Wilson interval, and where measured the images `lost` and `gained` (paired)."""

    successes: int
    trials: int
    lost: int | None = None
    gained: int | None = None

    @property
    def paired(self) -> bool:
        return self.lost is not None and self.gained is not None

    def drop_bound(self, confidence: float) -> float | None:
        """The upper one-sided bound of its paired drop (a fraction); None when it was not measured paired."""
        if not self.paired:
            return None
        return paired_drop_bound(self.successes, self.lost, self.gained, self.trials, confidence)

    def drop_floor(self, confidence: float) -> float | None:
        """The lower one-sided bound of its paired drop at `confidence` (a fraction); None when not measured paired."""
        interval = self.drop_interval(2 * confidence - 1) if self.paired else None
        return None if interval is None else interval[0]

    @property
    def drop(self) -> float | None:
        """Its measured drop, (lost - gained) / trials (a fraction); None when it was not measured paired."""
        return (self.lost - self.gained) / self.trials if self.paired and self.trials else None

    def images_to_bound(self, max_drop: float, confidence: float, most: int = 1_000_000) -> int | None:
        """Fewest images on which a schedule with this one's rates would have its `drop_bound` within `max_drop` (a
        fraction): its own trials where it already is; None where not measured paired, where its drop exceeds
        `max_drop`, or beyond `most`."""
        if self.drop is None or self.drop > max_drop:
            return None

        def within(images: int) -> bool:
            lost, gained = round(self.lost * images / self.trials), round(self.gained * images / self.trials)
            both_right = min(round((self.successes - self.gained) * images / self.trials), images - lost - gained)
            return paired_drop_bound(both_right + gained, lost, gained, images, confidence) <= max_drop

        if within(self.trials):
            return self.trials
        low, high = self.trials, 2 * self.trials
        while not within(high):  # the bound shrinks as the images grow at the same rates
            if high > most:
                return None
            low, high = high, 2 * high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if within(middle) else (middle, high)
        return high if high <= most else None

    def drop_interval(self, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
        """Two-sided paired interval of its drop (a fraction); None when it was not measured paired."""
        if not self.paired:
            return None
        unpruned = self.successes + self.lost - self.gained
        return paired_difference_interval(unpruned, self.successes, self.lost, self.gained, self.trials, confidence)

    @classmethod
    def from_dict(cls, data: dict) -> Proportion:
        """What `to_dict` wrote."""
        return cls(int(data["correct"]), int(data["images"]), data.get("lost"), data.get("gained"))

    @property
    def value(self) -> float:
        return self.successes / self.trials if self.trials else math.nan

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        return wilson_interval(self.successes, self.trials, confidence)

    def to_dict(self, confidence: float = CONFIDENCE) -> dict:
        low, high = self.interval(confidence)
        paired = {"lost": self.lost, "gained": self.gained} if self.paired else {}
        return {"accuracy": round(self.value, 6), "ci": [round(low, 6), round(high, 6)],
                "correct": self.successes, "images": self.trials, **paired}


def difference_interval(a: Proportion, b: Proportion, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of a.value - b.value from the two Wilson intervals (Newcombe's hybrid score; wide when paired)."""
    (a_low, a_high), (b_low, b_high) = a.interval(confidence), b.interval(confidence)
    d = a.value - b.value
    return (d - math.sqrt((a.value - a_low) ** 2 + (b_high - b.value) ** 2),
            d + math.sqrt((a_high - a.value) ** 2 + (b.value - b_low) ** 2))


def largest_lost_within(base: int, gained: int, images: int, max_drop: float, confidence: float) -> int:
    """The most images a schedule may lose, gaining `gained`, for its paired drop bound at `confidence` to stay within
    `max_drop` (a fraction), where the unpruned model gets `base` of `images` right; -1 where even none is too many."""
    def within(lost: int) -> bool:
        return paired_drop_bound(base - lost + gained, lost, gained, images, confidence) <= max_drop + 1e-12

    if not within(0):
        return -1
    low, high = 0, base + 1  # within(low) holds; high is past the most there is to lose
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if within(middle) else (low, middle)
    return low


def chance_bound_within(base_rate: float, lost_rate: float, gained_rate: float, images: int, max_drop: float,
                        confidence: float) -> float:
    """The chance that a paired count on `images` fresh images has its drop bound at `confidence` within `max_drop`,
    where the unpruned model is right on a `base_rate` share and the schedule loses a `lost_rate` and gains a
    `gained_rate` share of all images: lost ~ Binomial(right, lost / base), gained ~ Binomial(wrong, gained / (1 -
    base)), the unpruned model's right images at their expected count."""
    from scipy.stats import binom

    base = min(images, max(0, round(base_rate * images)))
    wrong = images - base
    lose = min(1.0, lost_rate / base_rate) if base_rate > 0 else 0.0
    gain = min(1.0, gained_rate / (1 - base_rate)) if base_rate < 1 else 0.0
    most_gained = wrong if gain >= 1 else int(binom.ppf(1 - 1e-9, wrong, gain)) if gain > 0 else 0
    chance = 0.0
    for gained in range(most_gained + 1):
        lost = largest_lost_within(base, gained, images, max_drop, confidence)
        if lost >= 0:
            chance += float(binom.pmf(gained, wrong, gain) * binom.cdf(lost, base, lose))
    return min(1.0, chance)
