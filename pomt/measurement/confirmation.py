"""Candidate steps and the paired verdict on each: is the change between two counts real?

Candidates come from the pooled curve (`detected`), ranked in the order a search examines them. The verdict
measures the two counts alternately (A B, B A, ...) and tests their drift-corrected paired log-ratios, less the
trend's, at up to three looks that share alpha. A step is confirmed on at least MIN_ROUNDS rounds, when its estimate
clears the minimum step by MIN_STEP_SE standard errors and, while the rounds are few, no single round carries it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.design import Measurer, design_rounds
from pomt.measurement.drift import drift_profile
from pomt.measurement.robust import SCREEN_MIN_PAIRS, PairedEffect, paired_effect, pooled_pair_noise, trend
from pomt.measurement.steps import Step, detect_steps, paired_step

LOOK_ALPHAS = (0.5, 0.4, 0.1)  # shares of alpha at a confirmation's looks (half, all, twice its rounds)
PROMISING = 0.1  # p below which a candidate of at least the minimum step earns the extra look
STEADY_ROUND = 0.03  # drift (log) between a round's two visits below which it counts as taken in one state
MIN_ROUNDS = 3  # paired rounds a confirmed step rests on, after interference screening
MIN_STEP_SE = 1.0  # standard errors by which a confirmed step's estimate clears the minimum step

Round = tuple[Visit, Visit]  # (low, high) visits taken back to back


@dataclass(frozen=True)
class Confirmation:
    """The paired verdict on one candidate step between `low` and `high` tokens."""

    low: int
    high: int
    effect: PairedEffect | None
    accepted: bool
    kind: str  # "drop", "rise", or "none"
    reason: str
    candidate_z: float = 0.0
    screened: bool = False  # an aligned edge its coarse rounds showed to be no candidate

    @property
    def paired_pct(self) -> float | None:
        """Change from `high` to `low` tokens over the trend's, in % (positive: `low` is faster)."""
        return None if self.effect is None else self.effect.saving_pct[0]

    def to_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "accepted": self.accepted, "kind": self.kind,
                "reason": self.reason, "candidate_z": round(self.candidate_z, 2), "screened": self.screened,
                "paired_pct": None if self.paired_pct is None else round(self.paired_pct, 3),
                "paired": None if self.effect is None else self.effect.to_dict()}


def accepted(low: int, high: int, effect: PairedEffect, rounds: int, z: float) -> Confirmation:
    change = effect.excess - 1.0
    kind = "drop" if change < 0 else "rise"
    reason = f"confirmed: {kind} of {100 * abs(change):.1f}% (p = {effect.p_value:.2g}, {rounds} rounds)"
    return Confirmation(low, high, effect, True, kind, reason, z)


def rejected(low: int, high: int, reason: str, z: float, effect: PairedEffect | None = None, *,
             screened: bool = False) -> Confirmation:
    return Confirmation(low, high, effect, False, "none", reason, z, screened)


def confirmation_looks(confirm_rounds: int) -> list[tuple[int, float]]:
    """(rounds, share of alpha) of each look of a confirmation: half the rounds (at least three), all, and twice as
    many (LOOK_ALPHAS; coinciding looks merge). The shares sum to 1: a Bonferroni split over the looks."""
    looks: dict[int, float] = {}
    for rounds, share in zip((max(3, confirm_rounds // 2), confirm_rounds, 2 * confirm_rounds), LOOK_ALPHAS,
                             strict=True):
        looks[rounds] = looks.get(rounds, 0.0) + share
    return sorted(looks.items())


def one_round_carries(log_ratios: np.ndarray, effect: PairedEffect, min_step: float) -> bool:
    """Fewer rounds than interference screening needs, and without one of them the rest fall short of `min_step` or
    change direction: a round whose visits met different machine states must not carry a step alone."""
    if log_ratios.size >= SCREEN_MIN_PAIRS or log_ratios.size < 2:
        return False
    d = log_ratios - effect.offset
    others = (d.sum() - d) / (d.size - 1)  # the mean without each round in turn
    change = effect.excess - 1.0
    return not bool(np.all(np.sign(others) == np.sign(change)) and np.all(np.abs(np.expm1(others)) >= min_step))


def confirmed_steps(points: list[CurvePoint], confirmations: list[Confirmation]) -> list[Step]:
    """A `Step` for every accepted confirmation, its levels from the pooled curve."""
    level = {p.tokens: p.latency_ms for p in points}
    return sorted((paired_step(c.low, c.high, level[c.high], level[c.low], c.effect, c.candidate_z)
                   for c in confirmations if c.accepted and c.effect is not None), key=lambda step: step.tokens)


@dataclass(frozen=True)
class Candidate:
    """A possible step between `low` and `high` tokens, `z` its significance (noise units)."""

    low: int
    high: int
    z: float

    @property
    def span(self) -> tuple[int, int]:
        return self.low, self.high


def expected_levels(points: list[CurvePoint]) -> dict[int, float]:
    """The curve's smooth trend at each of its counts (`pomt.measurement.robust.trend`, noise from the points)."""
    t = np.array([p.tokens for p in points], dtype=float)
    smooth = trend(t, np.array([p.latency_ms for p in points]), float(np.median([p.se_ms for p in points])))
    return dict(zip([p.tokens for p in points], smooth.tolist(), strict=True))


def level_change(points: list[CurvePoint], low: int, high: int,
                 expected: dict[int, float] | None = None) -> tuple[float, float]:
    """The curve's level change from `high` to `low` tokens over the trend's (a fraction, negative for a drop) and
    its standard error; `expected`: the curve's `expected_levels`, when already known."""
    level = {p.tokens: p for p in points}
    expected = expected if expected is not None else expected_levels(points)
    change = (level[low].latency_ms / expected[low]) / (level[high].latency_ms / expected[high]) - 1.0
    se = math.hypot(level[low].se_ms / level[low].latency_ms, level[high].se_ms / level[high].latency_ms)
    return change, se


def detected(points: list[CurvePoint], k: float, steps: list[Confirmation]) -> list[Candidate]:
    """Every candidate the detector sees at `k` on the pooled curve with the confirmed `steps` taken out: a spike
    gives one candidate on each side; one that ends at a confirmed step is trimmed to its other side."""
    if len(points) < 4:
        return []
    tokens = [p.tokens for p in points]
    factor = confirmed_factor(tokens, steps)
    report = detect_steps(tokens, [p.latency_ms * f for p, f in zip(points, factor, strict=True)], k=k,
                          noise_ms=[p.se_ms * f for p, f in zip(points, factor, strict=True)])
    found = [(step.tokens, step.upper_tokens, step.significance) for step in report.steps]
    for n in report.spikes:
        i = tokens.index(n)
        if 0 < i < len(tokens) - 1:
            found += [(tokens[i - 1], n, k), (n, tokens[i + 1], k)]
    return [Candidate(*span, z) for low, high, z in found if (span := outside_confirmed(low, high, steps))]


def confirmed_factor(tokens: list[int], steps: list[Confirmation]) -> list[float]:
    """Per count, the product of the paired excess ratios of the confirmed steps below it."""
    return [math.prod(c.effect.excess for c in steps if c.high <= n) for n in tokens]


def outside_confirmed(low: int, high: int, steps: list[Confirmation]) -> tuple[int, int] | None:
    """The candidate span with a confirmed step at either end cut off, None when a confirmed step covers it."""
    for c in steps:
        if not (c.low < high and low < c.high):
            continue
        if c.high == high and c.low > low:
            high = c.low
        elif c.low == low and c.high < high:
            low = c.high
        else:
            return None
    return (low, high) if low < high else None


def ranked(candidates: Iterable[Candidate], open_edges: Iterable[tuple[int, int]], reach: int) -> list[Candidate]:
    """The most significant candidate of each span, in the order a search examines them: those within reach (high
    side above `reach`) first; within each, the open aligned edges first (their verdict is cheap), then by z."""
    edges = set(open_edges)
    unique = {c.span: c for c in sorted(candidates, key=lambda c: c.z)}
    return sorted(unique.values(), key=lambda c: (c.high <= reach, c.span not in edges, -c.z, c.low))


def sharpest(points: list[CurvePoint], low: int, high: int, min_step: float) -> tuple[int, int]:
    """The adjacent measured counts inside a candidate with the largest change over the trend, when that change
    alone reaches `min_step`; else the candidate itself (a ramp of small changes is judged whole)."""
    inside = [p.tokens for p in points if low <= p.tokens <= high]
    if len(inside) <= 2:
        return low, high
    expected = expected_levels(points)  # one trend fit for every interval inside
    size, a, b = max((abs(level_change(points, a, b, expected)[0]), a, b)
                     for a, b in zip(inside, inside[1:], strict=False))
    return (a, b) if size >= min_step else (low, high)


def unmeasured_inside(grid: list[int], visits: Sequence[Visit], low: int, high: int) -> list[int]:
    """The grid counts strictly between `low` and `high` that no visit measured yet."""
    measured = {v.tokens for v in visits}
    return [n for n in grid[grid.index(low) + 1 : grid.index(high)] if n not in measured]


def unsettled(visits: Sequence[Visit], low: int, high: int) -> list[int]:
    """Counts to measure again before a candidate is judged: its two counts until they have three visits, its
    measured neighbours outside it until they have two."""
    counts: dict[int, int] = {}
    for visit in visits:
        counts[visit.tokens] = counts.get(visit.tokens, 0) + 1
    measured = sorted(counts)
    i, j = measured.index(low), measured.index(high)
    wanted = {n: 2 for n in measured[max(0, i - 1) : i] + measured[j + 1 : j + 2]}
    wanted.update({low: 3, high: 3})
    return sorted(n for n, least in wanted.items() if counts[n] < least)


def next_counts(grid: list[int], visits: Sequence[Visit], low: int, high: int) -> list[int]:
    """What a candidate needs measured next: the middle unmeasured grid count inside it, else the unsettled counts
    (none: it is ready for its verdict)."""
    inside = unmeasured_inside(grid, visits, low, high)
    return [inside[len(inside) // 2]] if inside else unsettled(visits, low, high)


class Judge:
    """The paired rounds of every pair measured through a `Measurer`, and the verdicts on them (`judged`)."""

    def __init__(self, measurer: Measurer, *, alpha: float, min_step: float, confirm_rounds: int):
        self.measurer = measurer
        self.alpha, self.min_step, self.confirm_rounds = alpha, min_step, confirm_rounds
        self.rounds: dict[tuple[int, int], list[Round]] = {}
        self.judged: dict[tuple[int, int], Confirmation] = {}
        self._drift: tuple[int, dict[int, float]] | None = None

    def confirm(self, low: int, high: int, z: float, offset: float) -> Confirmation:
        """Measure `low` and `high` alternately and judge the step between them, beyond the trend's `offset` (log of
        the trend at low over high), at up to three looks (`confirmation_looks`; the last only for a candidate still
        promising and while the budget allows); rounds the design already holds count."""
        rounds = design_rounds(self.measurer.design, low, high)
        effect, alpha = None, self.alpha
        looks = confirmation_looks(self.confirm_rounds)
        for i, (look, share) in enumerate(looks):
            if i == len(looks) - 1 and not self._earns_extra_look(effect, 2 * (look - len(rounds))):
                break
            alpha = share * self.alpha
            while len(rounds) < look:
                taken = self.measurer.paired_round((high, low) if len(rounds) % 2 == 0 else (low, high))
                rounds.append((taken[low], taken[high]))
                self.rounds[(low, high)] = rounds
            effect = self.effect(rounds, offset)
            if self.convincing(effect, alpha, rounds):
                return accepted(low, high, effect, len(rounds), z)
        change = effect.excess - 1.0
        if effect.p_value >= alpha:
            reason = f"not significant (p = {effect.p_value:.2g} >= {alpha:.2g}, {len(rounds)} rounds)"
        elif effect.pairs < (least := MIN_ROUNDS if self.steady(rounds) else SCREEN_MIN_PAIRS):
            reason = f"too few rounds left after interference screening ({effect.pairs} < {least})"
        elif abs(change) < self.min_step:
            reason = f"smaller than the minimum step ({100 * abs(change):.1f}% < {100 * self.min_step:.1f}%)"
        elif not self.clears_min_step(effect):
            reason = (f"not clear of the minimum step: {100 * abs(change):.1f}% less {MIN_STEP_SE:g} standard error "
                      f"({100 * effect.standard_error:.1f}%) < {100 * self.min_step:.1f}%")
        else:
            reason = f"carried by one of its {len(rounds)} rounds: without it the rest read less than the minimum step"
        return rejected(low, high, reason, z, effect)

    def screen(self, low: int, high: int, offset: float, candidate_k: float) -> float | None:
        """Judge a pair on the rounds it holds, at confirmation's first look: confirmed, or screened out when clearly
        below `min_step` or under `candidate_k` standard errors from the trend (None once judged), else the
        candidate's significance."""
        rounds = self.rounds[(low, high)]
        effect = self.effect(rounds, offset)
        change, se = effect.excess - 1.0, effect.standard_error
        z = abs(change) / se if se > 0 else math.inf
        if self.convincing(effect, LOOK_ALPHAS[0] * self.alpha, rounds):
            self.judged[(low, high)] = accepted(low, high, effect, len(rounds), z)
        elif abs(change) + 2.0 * se < self.min_step:
            reason = (f"smaller than the minimum step by its paired rounds ({100 * abs(change):.1f}% "
                      f"+- {200 * se:.1f}% < {100 * self.min_step:.1f}%)")
            self.judged[(low, high)] = rejected(low, high, reason, z, effect, screened=True)
        elif z < candidate_k:
            reason = f"no candidate: its paired rounds put it {z:.1f} standard errors from the trend"
            self.judged[(low, high)] = rejected(low, high, reason, z, effect, screened=True)
        else:
            return z
        return None

    def _earns_extra_look(self, effect: PairedEffect, cost: int) -> bool:
        """Still promising after the regular looks, and the budget can pay the `cost` visits of the extra rounds."""
        return effect.p_value < PROMISING and abs(effect.excess - 1.0) >= self.min_step and self.measurer.left() >= cost

    def clears_min_step(self, effect: PairedEffect) -> bool:
        """The estimate less MIN_STEP_SE standard errors is at least `min_step` (module docstring)."""
        return abs(effect.excess - 1.0) - MIN_STEP_SE * effect.standard_error >= self.min_step

    def convincing(self, effect: PairedEffect, alpha: float, rounds: list[Round]) -> bool:
        """Significant at `alpha`, clear of `min_step`, carried by at least MIN_ROUNDS kept rounds (SCREEN_MIN_PAIRS
        when the pair is tested on its own spread), and by no single round (`one_round_carries`)."""
        least = MIN_ROUNDS if self.steady(rounds) else SCREEN_MIN_PAIRS
        return (effect.p_value < alpha and self.clears_min_step(effect) and effect.pairs >= least
                and not one_round_carries(self.log_ratios(rounds), effect, self.min_step))

    def effect(self, rounds: list[Round], offset: float) -> PairedEffect:
        """The drift-corrected paired effect of high over low tokens, its t-test moderated by the noise of every
        other `steady` pair; pairs not `steady` are tested on their own, and lend nothing."""
        own = {(a.tokens, b.tokens) for a, b in rounds}
        d = self.log_ratios(rounds)
        if not self.steady(rounds):
            return paired_effect(np.ones(d.size), np.exp(d), offset=offset)
        others = [self.log_ratios(r) for pair, r in self.rounds.items() if pair not in own and self.steady(r)]
        return paired_effect(np.ones(d.size), np.exp(d), offset=offset, prior=pooled_pair_noise(others))

    def steady(self, rounds: list[Round]) -> bool:
        """Every round's two visits were taken in one state of the machine: the drift profile moved by less than
        STEADY_ROUND between them."""
        g = self._drift_log()
        return all(abs(g[id(a)] - g[id(b)]) < STEADY_ROUND for a, b in rounds)

    def log_ratios(self, rounds: list[Round]) -> np.ndarray:
        """log(low / high) of each round, each visit with the drift at its time divided out (in a replay it restores
        the pairing of visits taken at different moments)."""
        g = self._drift_log()
        return np.array([math.log(a.median_ms / b.median_ms) - g[id(a)] + g[id(b)] for a, b in rounds])

    def _drift_log(self) -> dict[int, float]:
        """The log drift at every visit so far (by the visit's id), from `drift_profile`; cached per visit."""
        everything = self.measurer.visits()
        if self._drift is None or self._drift[0] != len(everything):
            _, drift_log = drift_profile(everything)
            self._drift = (len(everything), {id(v): g for v, g in zip(everything, drift_log, strict=True)})
        return self._drift[1]


__all__ = ["LOOK_ALPHAS", "MIN_ROUNDS", "MIN_STEP_SE", "Candidate", "Confirmation", "Judge", "accepted",
           "confirmation_looks", "confirmed_factor", "confirmed_steps", "detected", "expected_levels", "level_change",
           "next_counts", "one_round_carries", "ranked", "rejected", "sharpest", "unmeasured_inside", "unsettled"]
