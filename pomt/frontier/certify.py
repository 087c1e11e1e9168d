"""Certification of the finalists on the held-out images (pure): the search explores on its own split, and the few
schedules sent to verification are certified on images its choice never saw, each at the family-wise error
1 - confidence divided among them (Bonferroni), so the promise holds for whichever certified schedule ships.

A finalist is measured in looks at a quarter, a half, three quarters and all of the held-out images: it stops as
certified at the first look where its paired drop bound is within the goal, or as failed once its drop is surely
beyond it. Each interim look spends `INTERIM_SPEND` of the finalist's error and the last the rest (a union bound),
so the looks keep the promise; stopping for failure only gives up chances to certify.

The finalists are planned on the search split: each schedule's chance to certify on the held-out images at its
share of the error (`certify_chance`), and how many to certify and which, to make the expected speedup of the
fastest certified one highest (`finalists`): a bolder schedule is sent only where the held-out images give it a
chance, and a safer one holds the run where it fails."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from pomt.errors import CalibrationError
from pomt.frontier.calibration import HELD_OUT
from pomt.frontier.candidates import FAMILIES, NONE
from pomt.frontier.choice import Evaluated, FrontierResult, Goal, ordered
from pomt.frontier.search import Promise, with_held_out
from pomt.stats import Proportion, chance_bound_within, one_sided_interval

LOOKS = (0.25, 0.5, 0.75, 1.0)  # shares of the held-out images at which a finalist may be certified
INTERIM_SPEND = 0.05  # of a finalist's error spent at each interim look; the last look spends the rest
FAIL_CONFIDENCE = 0.999  # of a drop surely beyond the goal, checked after every batch
FINALISTS = 4  # finalists certified at most by default: the share of error each gets and the held-out size plan on it
MIN_GAIN = 0.01  # of expected speedup a further finalist must add, else the error stays with fewer
CERTIFIED, FAILED = "certified", "failed"


@dataclass(frozen=True)
class Certifier:
    """The sequential test of `finalists` schedules on `images` held-out images measured `batch_size` at a time, at
    family-wise `confidence`, of a drop within `max_drop` (a fraction); called on a running count it says stop."""

    finalists: int
    images: int
    batch_size: int
    max_drop: float
    confidence: float

    @property
    def error(self) -> float:
        """The error each finalist may spend (Bonferroni)."""
        return (1.0 - self.confidence) / max(1, self.finalists)

    @property
    def looks(self) -> tuple[int, ...]:
        """Held-out images at each look: whole batches, the last all of them."""
        sizes = [min(self.images, math.ceil(share * self.images / self.batch_size) * self.batch_size)
                 for share in LOOKS]
        return tuple(sorted(set(sizes) | {self.images}))

    def look_confidence(self, images: int) -> float | None:
        """The one-sided confidence of the bound judged at a look of `images` (None: not a look)."""
        looks = self.looks
        if images not in looks:
            return None
        interim = self.error * INTERIM_SPEND
        spent = interim if images < self.images else self.error - interim * (len(looks) - 1)
        return 1.0 - spent

    def certified(self, measured: Proportion) -> bool:
        """Whether the running count certifies its drop within the goal at a look."""
        confidence = self.look_confidence(measured.trials)
        bound = None if confidence is None else measured.drop_bound(confidence)
        return bound is not None and bound <= self.max_drop + 1e-12

    def failed(self, measured: Proportion) -> bool:
        """Whether the drop is surely beyond the goal (lower bound at `FAIL_CONFIDENCE`)."""
        floor = measured.drop_floor(FAIL_CONFIDENCE)
        return floor is not None and floor > self.max_drop

    def __call__(self, measured: Proportion) -> bool:
        return self.certified(measured) or self.failed(measured)

    def verdict(self, measured: Proportion) -> str:
        """`CERTIFIED` or `FAILED` for a finalist's final count (stopped at a look, or over every image)."""
        return CERTIFIED if self.certified(measured) else FAILED

    def final_confidence(self) -> float:
        """The confidence of the bound at the last look."""
        return self.look_confidence(self.images) or self.confidence

    def images_to_certify(self, measured: Proportion) -> int | None:
        """Held-out images on which a schedule with these rates would certify at the last look (None: never)."""
        return measured.images_to_bound(self.max_drop, self.final_confidence())

    def key(self) -> str:
        """What the counts of this test depend on (a stopped count is only reused by the same test)."""
        return f"certify:{self.finalists}:{self.confidence:g}:{self.max_drop:g}:{self.batch_size}"


def images_to_certify_unchanged(max_drop: float, confidence: float, finalists: int = FINALISTS) -> int:
    """Held-out images on which a schedule that changed none would certify at the last look: the fewest worth
    holding out."""
    last_spend = (1.0 - confidence) / max(1, finalists) * (1 - (len(LOOKS) - 1) * INTERIM_SPEND)
    return Proportion(1, 1, 0, 0).images_to_bound(max_drop, 1.0 - last_spend) or 1_000_000


def check_certifiable(held_out: int, max_drop: float, confidence: float, finalists: int = FINALISTS) -> None:
    """Raise CalibrationError where `held_out` images could not certify even a schedule that changed no prediction."""
    if max_drop <= 0:
        raise CalibrationError(f"--max-accuracy-drop must be positive, got {100 * max_drop:g}")
    needed = images_to_certify_unchanged(max_drop, confidence, finalists)
    if held_out < needed:
        raise CalibrationError(
            f"{held_out} held-out images cannot certify a drop within {100 * max_drop:g} points at {confidence:.0%} "
            f"for {finalists} finalists, not even of a schedule that changes no prediction: that takes {needed} "
            "(more images, a larger --max-accuracy-drop, a lower --accuracy-confidence or fewer --finalists)")


def held_out_size(images: int) -> int:
    """Images to hold out of `images` to certify on: all but the `SEARCH_SHARE` the search explores on (ranking
    schedules by measured drops takes fewer images than bounding a finalist's drop family-wise), never every image."""
    return min(images - 1, max(1, images - math.ceil(images * SEARCH_SHARE)))


class Measures(Protocol):
    """What certification measures on (`Calibration`, `HostedCalibration`)."""

    def size(self, split: str) -> int: ...

    def measure(self, candidates: Sequence, split: str, stop_above: float | None = None,
                certifier: Certifier | None = None) -> Mapping: ...


SEARCH_SHARE = 1 / 3  # of the calibration images: the search split; the held-out rest certifies
EXPLORE = 0.5  # the search split judges drops on their measured value: it explores, the held-out images certify
PLAN_CONFIDENCE = 0.75  # a finalist's chance is planned on its search-split loss rate at this upper bound: the
# search chose it among many for the images it lost, so its held-out loss tends to be higher


def certify_chance(point: Evaluated, baseline: Proportion, plan: Certifier) -> float:
    """The chance that `point` certifies at the last look of `plan`, at its search-split gain rate and its loss rate
    at the upper bound at `PLAN_CONFIDENCE`; 0 where its search count is not paired or stopped early."""
    search = point.search
    if not search.paired or search.trials < baseline.trials or not search.trials:
        return 0.0
    lost_rate = one_sided_interval(search.lost, search.trials, PLAN_CONFIDENCE)[1]
    base_rate = (search.successes + search.lost - search.gained) / search.trials
    return chance_bound_within(base_rate, lost_rate, search.gained / search.trials, plan.images, plan.max_drop,
                               plan.final_confidence())


def certification_promise(goal: Goal, held_out: int, count: int = FINALISTS) -> Promise:
    """A point's `certify_chance` (given the unpruned one) when `count` finalists are certified on `held_out`
    images: what the search aims at (`pomt.frontier.search.FrontierSearch.within_goal`)."""
    plan = Certifier(max(1, count), held_out, 1, goal.max_drop_points / 100, goal.confidence)
    chances: dict[tuple[Proportion, Proportion], float] = {}  # a search asks again after every measurement

    def promise(point: Evaluated, baseline: Evaluated) -> float:
        counts = (point.search, baseline.search)
        if counts not in chances:
            chances[counts] = certify_chance(point, baseline.search, plan)
        return chances[counts]

    return promise


def expected_speedup(picked: Sequence[tuple[float, float]]) -> float:
    """The expected speedup of what ships from finalists given as (speedup, chance to certify), taken as
    independent: the fastest certified one's, or 1 (the unpruned model) where none certifies."""
    expected, none_yet = 0.0, 1.0
    for speedup, chance in sorted(picked, reverse=True):
        expected += none_yet * chance * speedup
        none_yet *= 1 - chance
    return expected + none_yet


def ladder(pool: Sequence[Evaluated], baseline: Evaluated, plan: Certifier) -> tuple[list[Evaluated], float]:
    """At most `plan.finalists` of `pool` and their expected speedup as `plan` certifies them: first the uniform
    schedule of the highest expected speedup (its predicted speedup times its `certify_chance`: the best of the
    uniform families by the same rule), where more than one is certified; then one at a time the schedule that most
    raises the `expected_speedup` of them all, while one raises it by `MIN_GAIN`."""
    odds = {p: (baseline.predicted_ms / p.predicted_ms, certify_chance(p, baseline.search, plan)) for p in pool}
    uniform = [p for p in pool if p.family in FAMILIES]
    chosen = [max(uniform, key=lambda p: odds[p][0] * odds[p][1])] if uniform and plan.finalists > 1 else []
    now = expected_speedup([odds[p] for p in chosen])
    while len(chosen) < plan.finalists:
        gains = {p: expected_speedup([odds[q] for q in (*chosen, p)]) for p in pool if p not in chosen}
        best = max(gains, key=gains.get, default=None)
        if best is None or gains[best] <= now + MIN_GAIN:
            break
        chosen.append(best)
        now = gains[best]
    return chosen, now


def finalists(result: FrontierResult, goal: Goal, held_out: int, count: int = FINALISTS) -> list[Evaluated]:
    """At most `count` schedules to certify on `held_out` images: the `ladder` of the number of finalists (each
    certified at its share of the error) whose shipped schedule has the highest expected speedup, a uniform one
    among them where `count` > 1. Only schedules predicted faster than the unpruned model that the search split
    passes on the measured drop are taken."""
    baseline = result.baseline
    faster = [p for p in result.evaluated if not p.candidate.unpruned and p.predicted_ms < baseline.predicted_ms]
    pool = ordered(faster, baseline.accuracy, replace(goal, confidence=EXPLORE))
    best: tuple[list[Evaluated], float] = ([], 1.0)
    fewest = 2 if count > 1 and any(p.family in FAMILIES for p in pool) else 1  # a uniform one to beat, certified
    for size in range(fewest, count + 1) if pool else ():
        chosen, expected = ladder(pool, baseline, Certifier(size, held_out, 1, goal.max_drop_points / 100,
                                                             goal.confidence))
        if expected > best[1] + MIN_GAIN:
            best = (chosen, expected)
    return best[0]


@dataclass(frozen=True)
class Certification:
    """The finalists with their held-out counts, and the test that judged them."""

    certifier: Certifier
    finalists: tuple[Evaluated, ...]

    def verdict(self, point: Evaluated) -> str:
        return FAILED if point.held_out is None else self.certifier.verdict(point.held_out)

    @property
    def certified(self) -> tuple[Evaluated, ...]:
        return tuple(p for p in self.finalists if self.verdict(p) == CERTIFIED)

    def bound(self, point: Evaluated) -> float | None:
        """The drop bound a finalist was judged on (a fraction): at its look, or at the last look."""
        held = point.held_out
        confidence = self.certifier.look_confidence(held.trials) or self.certifier.final_confidence()
        return held.drop_bound(confidence)

    def row(self, point: Evaluated) -> dict:
        """One finalist as the schedule and frontier files state it (drops in points)."""
        held, bound = point.held_out, self.bound(point)
        to_certify = None if self.verdict(point) == CERTIFIED else self.certifier.images_to_certify(held)
        return {"key": point.candidate.key, "family": point.family, "verdict": self.verdict(point),
                "images": held.trials, "lost": held.lost, "gained": held.gained,
                "drop_points": round(100 * held.drop, 3),
                "bound_points": None if bound is None else round(100 * bound, 3),
                "images_to_certify": to_certify}

    def to_dict(self) -> dict:
        c = self.certifier
        return {"confidence": c.confidence, "finalists": c.finalists, "held_out_images": c.images,
                "looks": list(c.looks), "max_drop_points": round(100 * c.max_drop, 6),
                "schedules": [self.row(p) for p in self.finalists]}


def certified(result: FrontierResult, goal: Goal, calibration: Measures, count: int,
              batch_size: int) -> tuple[FrontierResult, Certification]:
    """At most `count` finalists the search split passes, measured on the held-out images (`batch_size` at a time)
    until each is certified or fails."""
    chosen = finalists(result, goal, calibration.size(HELD_OUT), count)
    certifier = Certifier(max(1, len(chosen)), calibration.size(HELD_OUT), batch_size, goal.max_drop_points / 100,
                          goal.confidence)
    wanted = [NONE, *(p.candidate for p in chosen)]
    result = with_held_out(result, lambda cs: calibration.measure(cs, HELD_OUT, certifier=certifier), wanted)
    by_candidate = {e.candidate: e for e in result.evaluated}
    return result, Certification(certifier, tuple(by_candidate[p.candidate] for p in chosen))


def certified_uniform(certification: Certification) -> Evaluated | None:
    """The fastest predicted certified schedule of a uniform family: the one to beat (None: none certified)."""
    uniform = [p for p in certification.certified if p.family in FAMILIES]
    return min(uniform, key=lambda p: (p.predicted_ms, p.candidate), default=None)


def certification_notes(certification: Certification, held_out_share: float) -> tuple[str, ...]:
    """What the certification found, and which failed finalists more images would certify and how many."""
    c = certification.certifier
    certified = certification.certified
    lines = [f"certified {len(certified)} of {len(certification.finalists)} finalists on up to {c.images} held-out "
             f"images (drop within {100 * c.max_drop:g} points, {c.confidence:.0%} for all together)"]
    for point in certification.finalists:
        if certification.verdict(point) == CERTIFIED:
            continue
        row = certification.row(point)
        text = (f"not certified: {row['key']} ({row['family']}), held-out drop {row['drop_points']:+.2f} points "
                f"({row['lost']} lost, {row['gained']} gained of {row['images']}), bound {row['bound_points']:.2f}")
        if row["images_to_certify"] is not None:
            more = row["images_to_certify"]
            text += (f"; at the same rates about {more} held-out images would certify it (--accuracy-samples "
                     f"{math.ceil(more / held_out_share)} at this held-out share)")
        lines.append(text)
    return tuple(lines)
