"""The paired verdict on one candidate step: is the change between two counts real?

The two counts are measured alternately (A B, B A, ...) and judged on their paired log-ratios, each visit
with the drift at its time divided out, less what the smooth trend predicts across them: a t-test at up to
three looks that share alpha (`confirmation_looks`), moderated by the noise of the other pairs when the
rounds were taken in one state of the machine. A step is confirmed on at least MIN_ROUNDS rounds, when its
estimate clears the minimum step by MIN_STEP_SE standard errors, and while the rounds are few, when no single
round carries it.

Until 2026-11-30 the estimate had only to reach the minimum step. The device's own steps of 2-3% then passed as
3% steps whenever their rounds happened to read them large: 11 of the issue-29 bank's 17 false steps. One
standard error removed those 11 and left the recall of its injected steps as it was
(docs/results/amd-epyc-2core-2026-11-30-h.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.design import Measurer, design_rounds
from pomt.measurement.drift import drift_profile
from pomt.measurement.paired import SCREEN_MIN_PAIRS, PairedEffect, paired_effect, pooled_pair_noise
from pomt.measurement.steps import Step, paired_step

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
        return {
            "low": self.low, "high": self.high, "accepted": self.accepted, "kind": self.kind,
            "reason": self.reason, "candidate_z": round(self.candidate_z, 2), "screened": self.screened,
            "paired_pct": None if self.paired_pct is None else round(self.paired_pct, 3),
            "paired": None if self.effect is None else self.effect.to_dict(),
        }


def accepted(low: int, high: int, effect: PairedEffect, rounds: int, z: float) -> Confirmation:
    change = effect.excess - 1.0
    kind = "drop" if change < 0 else "rise"
    reason = f"confirmed: {kind} of {100 * abs(change):.1f}% (p = {effect.p_value:.2g}, {rounds} rounds)"
    return Confirmation(low, high, effect, True, kind, reason, z)


def rejected(low: int, high: int, reason: str, z: float, effect: PairedEffect | None = None, *,
             screened: bool = False) -> Confirmation:
    return Confirmation(low, high, effect, False, "none", reason, z, screened)


def confirmation_looks(confirm_rounds: int) -> list[tuple[int, float]]:
    """(rounds, share of alpha) of each look of a confirmation: half the rounds (at least three), all of
    them, and twice as many for a candidate still promising (LOOK_ALPHAS; the first two merge, shares
    added, when they coincide). The shares sum to 1: a Bonferroni split over the looks."""
    looks: dict[int, float] = {}
    for rounds, share in zip((max(3, confirm_rounds // 2), confirm_rounds, 2 * confirm_rounds), LOOK_ALPHAS,
                             strict=True):
        looks[rounds] = looks.get(rounds, 0.0) + share
    return sorted(looks.items())


def one_round_carries(log_ratios: np.ndarray, effect: PairedEffect, min_step: float) -> bool:
    """Fewer rounds than interference screening needs to judge a round by their own spread, and without
    one of them the rest fall short of `min_step` or change direction: a round whose two visits met
    different states of the machine must not carry a step alone."""
    if log_ratios.size >= SCREEN_MIN_PAIRS or log_ratios.size < 2:
        return False
    d = log_ratios - effect.offset
    others = (d.sum() - d) / (d.size - 1)  # the mean without each round in turn
    change = effect.excess - 1.0
    return not bool(np.all(np.sign(others) == np.sign(change)) and np.all(np.abs(np.expm1(others)) >= min_step))


def confirmed_steps(points: list[CurvePoint], confirmations: list[Confirmation]) -> list[Step]:
    """A `Step` for every accepted confirmation, its levels from the pooled curve."""
    level = {p.tokens: p.latency_ms for p in points}
    return sorted(
        (paired_step(c.low, c.high, level[c.high], level[c.low], c.effect, c.candidate_z)
         for c in confirmations if c.accepted and c.effect is not None),
        key=lambda step: step.tokens,
    )


class Judge:
    """The paired rounds of every pair measured through a `Measurer`, and the verdicts on them (`judged`)."""

    def __init__(self, measurer: Measurer, *, alpha: float, min_step: float, confirm_rounds: int):
        self.measurer = measurer
        self.alpha, self.min_step, self.confirm_rounds = alpha, min_step, confirm_rounds
        self.rounds: dict[tuple[int, int], list[Round]] = {}
        self.judged: dict[tuple[int, int], Confirmation] = {}
        self._drift: tuple[int, dict[int, float]] | None = None

    def confirm(self, low: int, high: int, z: float, offset: float) -> Confirmation:
        """Measure `low` and `high` alternately and judge the step between them, beyond the trend's `offset`
        (log of the trend at low over high); rounds the design already holds count.

        Up to three looks (`confirmation_looks`): after half the rounds, after all of them, and - only for
        a candidate still promising then (at least `min_step`, p below PROMISING) and while the budget
        allows - after twice as many; each look tests at its share of alpha, so together they keep the
        false-step rate at alpha. A clear step stops at the first look; a real step that its rounds leave
        just short of significance gets more rounds instead of a verdict that the next run may reverse.
        """
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
        """Judge a pair on the rounds it holds, at confirmation's first look: a step significant at that
        look's share of alpha (LOOK_ALPHAS) and at least `min_step` is confirmed; one whose estimate lies
        clearly below `min_step` (by 2 standard errors), or less than `candidate_k` standard errors from the
        trend (the detector's bar for a candidate), is rejected as screened; the rest stay candidates: None
        once judged, else that ratio as the candidate's significance."""
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
        """Still promising after the regular looks (at least `min_step`, p below PROMISING), and the budget
        can pay the `cost` visits of the extra rounds."""
        return (effect.p_value < PROMISING and abs(effect.excess - 1.0) >= self.min_step
                and self.measurer.left() >= cost)

    def clears_min_step(self, effect: PairedEffect) -> bool:
        """The estimate less MIN_STEP_SE standard errors is at least `min_step` (module docstring)."""
        return abs(effect.excess - 1.0) - MIN_STEP_SE * effect.standard_error >= self.min_step

    def convincing(self, effect: PairedEffect, alpha: float, rounds: list[Round]) -> bool:
        """Significant at `alpha`, clear of `min_step` (`clears_min_step`), carried by at least MIN_ROUNDS rounds that
        interference screening kept (SCREEN_MIN_PAIRS when the pair is tested on its own spread, borrowing
        no noise: three rounds' spread is a guess), and by no single round (`one_round_carries`)."""
        least = MIN_ROUNDS if self.steady(rounds) else SCREEN_MIN_PAIRS
        return (effect.p_value < alpha and self.clears_min_step(effect)
                and effect.pairs >= least
                and not one_round_carries(self.log_ratios(rounds), effect, self.min_step))

    def effect(self, rounds: list[Round], offset: float) -> PairedEffect:
        """The paired effect of high over low tokens, each visit corrected for the drift at its time, its
        t-test moderated by the noise of every other pair measured so far (`pomt.measurement.paired`).
        Borrowing that noise assumes every round's two visits were taken in one state of the machine
        (`steady`); pairs whose rounds were not are tested on their own, and lend nothing."""
        own = {(a.tokens, b.tokens) for a, b in rounds}
        d = self.log_ratios(rounds)
        if not self.steady(rounds):
            return paired_effect(np.ones(d.size), np.exp(d), offset=offset)
        others = [self.log_ratios(r) for pair, r in self.rounds.items() if pair not in own and self.steady(r)]
        return paired_effect(np.ones(d.size), np.exp(d), offset=offset, prior=pooled_pair_noise(others))

    def steady(self, rounds: list[Round]) -> bool:
        """Every round's two visits were taken in one state of the machine: the run's drift profile moved
        by less than STEADY_ROUND between them (live, visits back to back; a replay whose recording had
        them apart while the machine drifted fast fails)."""
        g = self._drift_log()
        return all(abs(g[id(a)] - g[id(b)]) < STEADY_ROUND for a, b in rounds)

    def log_ratios(self, rounds: list[Round]) -> np.ndarray:
        """log(low / high) of each round, each visit with the drift at its time divided out (the profile of
        every visit so far): live, a round's two visits are adjacent and the correction barely moves their
        ratio; in a replay, where they may come from different moments of the recording, it restores the
        pairing."""
        g = self._drift_log()
        return np.array([math.log(a.median_ms / b.median_ms) - g[id(a)] + g[id(b)] for a, b in rounds])

    def _drift_log(self) -> dict[int, float]:
        """The log drift at every visit so far (by the visit's id), from `drift_profile`; cached per visit."""
        everything = self.measurer.visits()
        if self._drift is None or self._drift[0] != len(everything):
            _, drift_log = drift_profile(everything)
            self._drift = (len(everything), {id(v): g for v, g in zip(everything, drift_log, strict=True)})
        return self._drift[1]


__all__ = ["LOOK_ALPHAS", "MIN_ROUNDS", "MIN_STEP_SE", "Confirmation", "Judge", "accepted", "confirmation_looks",
           "confirmed_steps", "one_round_carries", "rejected"]
