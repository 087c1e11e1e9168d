"""Which token counts to measure, in which order, and which latency steps are real.

Measurement design (so that a machine whose speed drifts does not shape the curve):
- Passes. The counts of a set are visited once per pass in a seeded random order, with the reference
  count (N) in every pass: a randomised block design. Each count pools its passes, every visit taken
  relative to its pass's reference visit (`pomt.measurement.drift.pool_visits`). Never one ascending sweep.
- Full search: every grid count in `passes` passes.
- Adaptive search: a coarse subset in `coarse_passes` passes (enough to flag candidates: confirmation
  decides). Where the grid allows, the subset is the aligned edges: every multiple a of `align` below N
  with a - 1, visited back to back (A B, then B A the next pass), so the coarse passes are already
  paired rounds of each such edge (`judge_anchors`: kernels favour aligned sizes, so many real steps
  sit there); else every `coarse_stride`-th count. A caller whose policy reaches only the counts from
  `focus_from` up (a latency-only run removes at most a quarter of the patch tokens) gets the aligned
  edges within that reach, and below it every `coarse_stride`-th count for the curve's shape: the visits
  go where a schedule can land. Then, wherever the step detector (at the lower
  `candidate_k` threshold) sees a candidate with unmeasured grid counts inside it, the middle one is
  measured - every such midpoint of a round together, in `refine_passes` shuffled passes with the
  reference - until no candidate has an unmeasured count inside, or the budget (a fraction of the full
  grid's visits, never less than the coarse scan plus room for three candidates) is spent. A one-point
  feature (a spike) is bisected on both sides.
- Confirmation, the one test for a step. Each candidate (the aligned edges left open first, as their
  verdict costs least; then the most significant first) is measured alternately at its two counts (A B,
  B A, ... for `confirm_rounds` rounds, in the same warm state; rounds the design already holds count).
  It is accepted when the paired log-ratio, less what the smooth trend predicts across it, differs from 0
  by a t-test at `alpha`, by at least `min_step`, on at least MIN_ROUNDS rounds, at up to three looks
  that share `alpha` (`confirmation_looks`; the third, at twice `confirm_rounds`, only for a candidate
  still promising); while the rounds are few, no single round may carry the verdict. The test borrows
  the noise of the other pairs measured (a moderated t-test, `pomt.measurement.paired.paired_effect`) when all its
  rounds were taken in one state of the machine (`_steady`). Only confirmed steps are reported; a
  non-monotone edge (fewer tokens, more time) is confirmed the same way. The curve a search returns is
  reconciled with its paired rounds (`pomt.measurement.drift.reconcile_levels`), a judged pair with the effect its
  verdict rests on.
A visit is one untimed forward at the new count and `reps` timed forwards; the budget, the full grid's
cost and every figure the search reports count visits. Given its seed and what it measures the search
is deterministic, so a run resumed from its journal (`pomt.measurement.sources.Session`) continues exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from pomt.errors import GridError
from pomt.formats.trace import Visit
from pomt.measurement.drift import (
    CurvePoint,
    Drift,
    corrected_values,
    drift,
    drift_profile,
    pool_visits,
    reconcile_levels,
    relative_noise,
)
from pomt.measurement.paired import SCREEN_MIN_PAIRS, PairedEffect, paired_effect, pooled_pair_noise
from pomt.measurement.sources import Session, TraceExhausted, calibrate_reps
from pomt.measurement.steps import Step, detect_steps, paired_step, trend
from pomt.options import option

CALIBRATION_REPS = 3
LOOK_ALPHAS = (0.5, 0.4, 0.1)  # shares of alpha at a confirmation's looks (half, all, twice its rounds)
PROMISING = 0.1  # p below which a candidate of at least the minimum step earns the extra look
LEAST_CANDIDATES = 3  # candidates the smallest adaptive budget can still examine
FOCUS = 3  # candidates an adaptive round works on at once, most significant first
STEADY_ROUND = 0.03  # drift (log) between a round's two visits below which it counts as taken in one state
MIN_ROUNDS = 3  # paired rounds a confirmed step rests on, after interference screening


def token_grid(start: int, stop: int, stride: int, *, min_tokens: int, max_tokens: int) -> list[int]:
    """Counts from `start` towards `stop` every `stride` (both ends included), ascending.

    `min_tokens` is P + 1 (one patch token kept), `max_tokens` is N.
    """
    lo, hi = min(start, stop), max(start, stop)
    if stride < 1:
        raise GridError(f"token grid stride must be at least 1, got {stride}")
    if lo < min_tokens or hi > max_tokens:
        raise GridError(
            f"token grid {lo}..{hi} lies outside the allowed range [{min_tokens}, {max_tokens}] "
            "(at least one patch token kept, at most all N tokens)"
        )
    direction = 1 if stop >= start else -1
    counts = set(range(start, stop + direction, direction * stride))
    counts.add(stop)
    return sorted(counts)


@dataclass(frozen=True)
class SearchSettings:
    """How a search measures and when it believes a step; each field is also the CLI option of its name."""

    passes: int = option(6, "Shuffled passes over every count of a full search, the reference (N) in each; the "
                            "adaptive search's budget is a fraction of that full grid.", min=2)
    coarse_passes: int = option(3, "Shuffled passes over the adaptive search's coarse counts.", min=2)
    refine_passes: int = option(1, "Passes over each round of counts an adaptive search adds.", min=1)
    reps: int | None = option(None, "Timed forwards per visit (default: about --visit-s of timing).", min=1)
    visit_s: float = option(0.1, "Seconds of timing a visit aims at, when --reps is not given.")
    coarse_stride: int | None = option(None, "Adaptive search's coarse stride (default: sqrt of the grid).", min=1)
    candidate_k: float = option(3.0, "Detector threshold (noise units) for a candidate step.")
    step_alpha: float = option(0.01, "False-step rate of the paired confirmation (t-test level).")
    min_step: float = option(0.03, "Smallest step (fraction of latency, beyond the trend) that is reported.")
    confirm_rounds: int = option(6, "Paired rounds (A B, B A, ...) that confirm a step.", min=3)
    budget: float = option(0.2, "Adaptive search's most visits, as a fraction of the full grid's.")
    align: int = option(8, "Token alignment the hardware favours (SIMD width, GEMM or attention tile): the "
                           "adaptive search's coarse scan measures each multiple of it beside the count below, "
                           "as a pair, and tests each such edge for a step (0: a plain strided scan).", min=0)

    def check(self) -> SearchSettings:
        """Raise GridError for settings no search can run with."""
        problems = [
            (self.passes >= 2, f"--passes must be at least 2 (the noise comes from them), got {self.passes}"),
            (self.coarse_passes >= 2, f"--coarse-passes must be at least 2, got {self.coarse_passes}"),
            (self.refine_passes >= 1, f"--refine-passes must be at least 1, got {self.refine_passes}"),
            (self.reps is None or self.reps >= 1, f"--reps must be at least 1, got {self.reps}"),
            (self.confirm_rounds >= 3, f"--confirm-rounds must be at least 3, got {self.confirm_rounds}"),
            (0.0 < self.step_alpha < 1.0, f"--step-alpha must lie in (0, 1), got {self.step_alpha}"),
            (self.min_step >= 0.0, f"--min-step must be >= 0, got {self.min_step}"),
            (0.0 < self.budget <= 1.0, f"--budget must lie in (0, 1], got {self.budget}"),
            (self.coarse_stride is None or self.coarse_stride >= 1,
             f"--coarse-stride must be at least 1, got {self.coarse_stride}"),
            (self.visit_s > 0, f"--visit-s must be positive, got {self.visit_s}"),
            (self.align >= 0, f"--align must be at least 0, got {self.align}"),
        ]
        for ok, message in problems:
            if not ok:
                raise GridError(message)
        return self


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
    screened: bool = False  # an aligned edge its coarse rounds showed to be no candidate (`judge_anchors`)

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


@dataclass
class SearchResult:
    """What a search measured and concluded."""

    points: list[CurvePoint]
    steps: list[Step]  # confirmed steps only
    candidates: list[Confirmation]  # every candidate and its verdict, confirmed or not
    drift: Drift | None
    noise: float  # one visit's relative spread between passes
    reps: int
    visits: int  # visits the search asked for (journal included)
    measured: int  # visits measured live in this run
    full_grid_visits: int
    budget_visits: int | None
    budget_spent: bool
    design: list[Visit] = field(default_factory=list, repr=False)

    @property
    def rejected(self) -> list[Confirmation]:
        return [c for c in self.candidates if not c.accepted]

    @property
    def screened(self) -> list[Confirmation]:
        """Aligned edges the coarse rounds alone showed to be no step (never candidates)."""
        return [c for c in self.candidates if c.screened]

    @property
    def rejected_candidates(self) -> list[Confirmation]:
        """Candidates examined and not confirmed (screened aligned edges left out)."""
        return [c for c in self.candidates if not c.accepted and not c.screened]

    @property
    def evaluation_ratio(self) -> float:
        return self.visits / self.full_grid_visits if self.full_grid_visits else math.nan

    def drift_exceeds(self, effects_pct: list[float]) -> str | None:
        """A sentence when the drift seen is larger than the smallest effect reported, else None."""
        if self.drift is None or not effects_pct:
            return None
        smallest = min(abs(e) for e in effects_pct)
        if self.drift.pct <= smallest:
            return None
        return (f"the machine drifted {self.drift.pct:.1f}% during measurement (reference "
                f"{self.drift.reference_tokens} tokens), more than the smallest effect reported ({smallest:.1f}%): "
                "steps and gains rest on paired measurements, absolute latencies do not")


class _BudgetSpent(Exception):
    """Raised inside a search when its visit budget is used up."""


class LatencySearch:
    """One search over a token grid through a `Session`; `run()` measures, refines and confirms."""

    def __init__(self, session: Session, grid: list[int], reference: int, settings: SearchSettings,
                 *, adaptive: bool = True, seed: int = 0, focus_from: int | None = None, progress: bool = True):
        if not grid:
            raise GridError("the token grid is empty")
        if reference not in grid:
            raise GridError(f"the token grid must include the reference count N = {reference}")
        self.session, self.grid, self.reference = session, sorted(set(grid)), reference
        self.settings = settings.check()
        self.position = {n: i for i, n in enumerate(self.grid)}
        self.adaptive = adaptive
        self.focus_from = focus_from  # the policy's reach: anchors from here up, candidates reaching it first
        self.rng = np.random.default_rng(seed)
        self.design: list[Visit] = []
        self.paired: list[Visit] = []
        self.judged: dict[tuple[int, int], Confirmation] = {}
        self.full_grid_visits = settings.passes * len(self.grid)
        aligned = self._anchor_pairs() if adaptive else []
        self.anchors = [pair for pair in aligned if focus_from is None or pair[0] >= focus_from]
        self.pending: dict[tuple[int, int], float] = {}  # anchor pairs the coarse rounds left open, with z
        self.coarse = self._coarse_units(sparse_below=len(self.anchors) < len(aligned))
        self.budget = max(int(settings.budget * self.full_grid_visits), self._least_budget()) if adaptive else None
        self.reps = settings.reps or 1
        self._pass = 0
        self._curve: tuple[tuple[int, int], list[CurvePoint]] | None = None
        self._drift: tuple[int, dict[int, float]] | None = None
        self.rounds: dict[tuple[int, int], list[tuple[Visit, Visit]]] = {}  # paired rounds of every pair tested
        total = self.budget or self.full_grid_visits
        self._bar = tqdm(total=total, desc="latency", unit="visit", disable=not progress)

    def _anchor_pairs(self) -> list[tuple[int, int]]:
        """(a - 1, a) for every multiple a of `align` below the reference with both counts on the grid."""
        align = self.settings.align
        if align < 2:
            return []
        return [(n - 1, n) for n in self.grid if n % align == 0 and n - 1 in self.position and n < self.reference]

    def _coarse_units(self, sparse_below: bool) -> list[tuple[int, ...]]:
        """What the adaptive search's coarse passes visit: the anchor pairs where the grid has them (each
        pair's counts back to back) and, with `sparse_below` (the caller's reach left anchors out), every
        `coarse_stride`-th count below the first one kept; else every `coarse_stride`-th count; the grid's
        ends always."""
        stride = self.settings.coarse_stride or max(2, round(math.sqrt(len(self.grid))))
        ends = {self.grid[0], self.grid[-1]}
        if not self.anchors:
            return [(n,) for n in sorted(set(self.grid[::stride]) | ends)]
        taken = {n for pair in self.anchors for n in pair}
        below = set(self.grid[self.position[self.anchors[0][0]] - 1 :: -stride]) if sparse_below else set()
        return [*self.anchors, *((n,) for n in sorted((below | ends) - taken))]

    def _least_budget(self) -> int:
        """On a small grid the fraction would not pay for the coarse scan: the budget never falls below the
        coarse scan plus room to carry three candidates to a verdict."""
        coarse = self.settings.coarse_passes * (sum(len(unit) for unit in self.coarse) + 1)
        return coarse + LEAST_CANDIDATES * (2 * self.settings.confirm_rounds + 6)

    def _visit(self, tokens: int, reps: int | None = None) -> Visit:
        if self.budget is not None and self.session.visits >= self.budget:
            raise _BudgetSpent
        visit = self.session.visit(tokens, reps or self.reps, self._pass)
        self._bar.update(1)
        return visit

    def _new_pass(self) -> int:
        self._pass += 1
        return self._pass

    def _calibrate(self) -> None:
        """Timed forwards per visit: the setting, a replayed trace's own, or from one visit of the
        reference (pass 0) so that a visit lasts about `visit_s`."""
        preferred = getattr(self.session.source, "preferred_reps", None)
        if self.settings.reps is not None or preferred is not None:
            self.reps = self.settings.reps or preferred
            return
        visit = self._visit(self.reference, CALIBRATION_REPS)
        self.reps = calibrate_reps(visit.median_ms / 1e3, self.settings.visit_s)

    def measure_passes(self, counts: list[int], passes: int, reference_visits: int = 1) -> None:
        """`passes` shuffled passes over `counts` plus the reference (`reference_visits` times in each)."""
        self.measure_units([(n,) for n in counts], passes, reference_visits)

    def measure_units(self, units: list[tuple[int, ...]], passes: int, reference_visits: int = 1) -> None:
        """`passes` passes over `units` plus the reference (`reference_visits` times in each): the units in
        a shuffled order, each unit's counts back to back, reversed every other pass (A B, then B A), so a
        unit of two counts is a paired round in every pass. A replay whose trace holds no more visits of the
        reference goes on without it: every visit is corrected by the drift profile of all of them."""
        members = sorted(u for u in set(units) if u != (self.reference,)) + [(self.reference,)] * reference_visits
        for p in range(passes):
            if not self.session.can_visit(self.reference):
                members = [u for u in members if u != (self.reference,)]
            ordered = [members[i][:: 1 if p % 2 == 0 else -1] for i in self.rng.permutation(len(members))]
            pass_index = self._new_pass()
            self.session.begin_pass(pass_index, [n for unit in ordered for n in unit])
            for unit in ordered:
                if len(unit) > 1:
                    self.session.begin_unit(pass_index, unit)
                self.design.extend(self._visit(n) for n in unit)

    def visits(self) -> list[Visit]:
        """Every visit so far: the design's passes and the confirmations' rounds."""
        return self.design + self.paired

    def curve(self) -> list[CurvePoint]:
        """The pooled, drift-corrected curve of every visit so far, reconciled with the paired rounds of
        every pair tested (`pomt.measurement.drift.reconcile_levels`); cached per visit, pair and verdict count.

        Confirmation visits count too: when a bisection was misled by one disturbed visit, the rounds
        of its (rejected) confirmation correct the levels and the detector moves the candidate. A pair
        already judged enters with the effect its verdict rests on, so the saved curve shows across it
        what the verdict saw, even where later visits move the drift profile (and with it whether its
        rounds count as steady, which decides the noise they borrow)."""
        key = (len(self.visits()), len(self.rounds), len(self.judged))
        if self._curve is None or self._curve[0] != key:
            pooled = pool_visits(self.visits(), self.reference)
            pairs = []
            for (low, high), rounds in self.rounds.items():
                verdict = self.judged.get((low, high))
                effect = verdict.effect if verdict and verdict.effect else self._paired(rounds, 0.0)
                pairs.append((low, high, math.log(effect.ratio), effect.standard_error))
            self._curve = (key, reconcile_levels(pooled, pairs, self.reference))
        return self._curve[1]

    def noise(self) -> float:
        return relative_noise(corrected_values(self.visits()))

    def candidates(self) -> list[tuple[int, int, float]]:
        """(low, high, z) of every candidate the detector sees at `candidate_k` on the pooled,
        drift-corrected curve (each point with its own standard error) with the confirmed steps taken
        out, and the anchor pairs the coarse rounds left open (`judge_anchors`): those that may hold a step
        within reach of the caller's policy (high side above `focus_from`) first, then the rest; within
        each, the open anchor pairs first (their counts are settled and half their rounds taken, so a
        verdict costs a few visits where a detector candidate still needs bisection and all its rounds),
        then most significant first. A spike gives one candidate on each side; a candidate that ends at
        a confirmed step is trimmed to its other side."""
        points = self.curve()
        out = [(low, high, z) for (low, high), z in self.pending.items()]
        if len(points) >= 4:
            tokens = [p.tokens for p in points]
            factor = self._confirmed_factor(tokens)
            report = detect_steps(tokens, [p.latency_ms * f for p, f in zip(points, factor, strict=True)],
                                  k=self.settings.candidate_k,
                                  noise_ms=[p.se_ms * f for p, f in zip(points, factor, strict=True)])
            found = [(step.tokens, step.upper_tokens, step.significance) for step in report.steps]
            for n in report.spikes:
                i = tokens.index(n)
                if 0 < i < len(tokens) - 1:
                    z = self.settings.candidate_k
                    found += [(tokens[i - 1], n, z), (n, tokens[i + 1], z)]
            out += [(*span, z) for low, high, z in found if (span := self._outside_confirmed(low, high))]
        reach = self.focus_from if self.focus_from is not None else 0
        unique = {c[:2]: c for c in sorted(out, key=lambda c: c[2])}  # the most significant of each span
        return sorted(unique.values(), key=lambda c: (c[1] <= reach, c[:2] not in self.pending, -c[2], c[0]))

    def _accepted_steps(self) -> list[Confirmation]:
        return [c for c in self.judged.values() if c.accepted and c.effect is not None]

    def _confirmed_factor(self, tokens: list[int]) -> list[float]:
        """Per count, what takes the confirmed steps below it out of its level: the product of their
        paired excess ratios (a step's high side then continues its low side's trend)."""
        steps = self._accepted_steps()
        return [math.prod(c.effect.excess for c in steps if c.high <= n) for n in tokens]

    def _outside_confirmed(self, low: int, high: int) -> tuple[int, int] | None:
        """The candidate span with a confirmed step at either end cut off, None when a confirmed step
        covers it."""
        for c in self._accepted_steps():
            if not (c.low < high and low < c.high):
                continue
            if c.high == high and c.low > low:
                high = c.low
            elif c.low == low and c.high < high:
                low = c.high
            else:
                return None
        return (low, high) if low < high else None

    def _trend_offset(self, low: int, high: int) -> float:
        """log(trend at low / trend at high): the change the smooth trend alone predicts across a step."""
        expected = expected_levels(self.curve())
        return math.log(expected[low] / expected[high]) if expected[low] > 0 < expected[high] else 0.0

    def _unmeasured_inside(self, low: int, high: int) -> list[int]:
        measured = {v.tokens for v in self.visits()}
        return [n for n in self.grid[self.position[low] + 1 : self.position[high]] if n not in measured]

    def _unsettled(self, low: int, high: int) -> list[int]:
        """Counts to measure again before a candidate is judged: its two counts until they have three
        visits (a median that one disturbed visit cannot move), its measured neighbours outside it until
        they have two. A bisection places candidates from single visits, which misplaces some."""
        counts: dict[int, int] = {}
        for visit in self.visits():
            counts[visit.tokens] = counts.get(visit.tokens, 0) + 1
        measured = sorted(counts)
        i, j = measured.index(low), measured.index(high)
        wanted = {n: 2 for n in measured[max(0, i - 1) : i] + measured[j + 1 : j + 2]}
        wanted.update({low: 3, high: 3})
        return sorted(n for n, least in wanted.items() if counts[n] < least)

    def _left(self) -> float:
        return math.inf if self.budget is None else self.budget - self.session.visits

    def design_rounds(self, low: int, high: int) -> list[tuple[Visit, Visit]]:
        """(low, high) visit pairs the design already holds: the two counts visited back to back in one
        pass (an anchor pair in every coarse pass; other counts by chance of the shuffle)."""
        rounds = []
        for first, second in zip(self.design, self.design[1:], strict=False):
            if first.pass_index == second.pass_index and {first.tokens, second.tokens} == {low, high}:
                rounds.append((first, second) if first.tokens == low else (second, first))
        return rounds

    def judge_anchors(self) -> None:
        """Judge each anchor pair on the paired rounds the coarse passes hold, at confirmation's first look:
        a step significant at that look's share of alpha (LOOK_ALPHAS) and at least `min_step` is
        confirmed; one whose estimate lies clearly below `min_step` (by 2 standard errors), or less than
        `candidate_k` standard errors from the trend (the detector's bar for a candidate), is rejected;
        the rest stay candidates (`pending`, with that ratio as significance), confirmed like any other
        by more rounds."""
        s = self.settings
        first_alpha = LOOK_ALPHAS[0] * s.step_alpha
        for pair in self.anchors:
            rounds = self.design_rounds(*pair)
            if len(rounds) >= 3:
                self.rounds[pair] = rounds
        for (low, high), rounds in list(self.rounds.items()):
            effect = self._paired(rounds, self._trend_offset(low, high))
            change = effect.excess - 1.0
            se = effect.standard_error
            z = abs(change) / se if se > 0 else math.inf
            if self._convincing(effect, first_alpha, rounds):
                self.judged[(low, high)] = self._accepted(low, high, effect, len(rounds), z)
            elif abs(change) + 2.0 * se < s.min_step:
                reason = (f"smaller than the minimum step by its paired rounds ({100 * abs(change):.1f}% "
                          f"+- {200 * se:.1f}% < {100 * s.min_step:.1f}%)")
                self.judged[(low, high)] = Confirmation(low, high, effect, False, "none", reason, z, screened=True)
            elif z < s.candidate_k:
                reason = f"no candidate: its paired rounds put it {z:.1f} standard errors from the trend"
                self.judged[(low, high)] = Confirmation(low, high, effect, False, "none", reason, z, screened=True)
            else:
                self.pending[(low, high)] = z

    def examine(self) -> list[Confirmation]:
        """Refine and confirm candidates in the order of `candidates` (open aligned edges, then the most
        significant), as far as the budget goes.

        Each round re-runs the detector on every visit so far. A candidate is ready when no grid count
        inside it is unmeasured and its counts are settled (`_unsettled`); the first ready one of the
        FOCUS first candidates is judged (first at its sharpest part, `_sharpest`): rejected
        at once when the curve's own estimate is clearly below `min_step`, else confirmed by paired
        measurement. When none is ready, one shuffled pass measures what the FOCUS first candidates
        need next (a midpoint, or counts to settle), as far as the remaining budget can carry
        them to a verdict: the budget goes to the clearest candidates first.
        """
        confirm_cost = 2 * self.settings.confirm_rounds
        judged = self.judged
        while True:
            todo = [c for c in self.candidates() if c[:2] not in judged]
            if not todo:
                break
            ready = [c for c in todo[:FOCUS] if not self._next_counts(c[0], c[1])]
            if ready:
                low, high, z = ready[0]
                sharpest = self._sharpest(low, high)
                if sharpest not in judged:  # a step the detector spread over its neighbours: its sharpest part
                    low, high = sharpest
                change, se = level_change(self.curve(), low, high)
                if abs(change) + 2.0 * se < self.settings.min_step:
                    reason = (f"smaller than the minimum step by the design's estimate "
                              f"({100 * abs(change):.1f}% +- {200 * se:.1f}% < {100 * self.settings.min_step:.1f}%)")
                    judged[(low, high)] = Confirmation(low, high, None, False, "none", reason, z)
                    continue
                if self._left() < self._rounds_cost(low, high):
                    break
                try:
                    judged[(low, high)] = self.confirm(low, high, z)
                except TraceExhausted as exc:
                    judged[(low, high)] = Confirmation(low, high, None, False, "none", f"not examined: {exc}", z)
                continue
            batch: set[int] = set()
            cost = 1  # the reference
            for low, high, _ in todo[:FOCUS]:
                wanted = set(self._next_counts(low, high)) - batch
                inside = self._unmeasured_inside(low, high)
                levels = math.ceil(math.log2(len(inside) + 1)) if inside else 0
                need = len(wanted) + levels + 3 + confirm_cost  # what is left to reach its verdict
                if cost + need > self._left():
                    break
                batch |= wanted
                cost += len(wanted)
            if not batch:
                break
            self.measure_passes(sorted(batch), 1)
        unjudged = [c for c in self.candidates() if c[:2] not in judged]
        skipped = [Confirmation(lo, hi, None, False, "none", "not examined: the visit budget is spent", z)
                   for lo, hi, z in unjudged]
        return list(judged.values()) + skipped

    def _rounds_cost(self, low: int, high: int) -> int:
        """Visits a candidate's paired rounds take to reach its regular verdict: the rounds the design
        already holds count (an aligned edge has one in every coarse pass)."""
        return 2 * max(0, self.settings.confirm_rounds - len(self.design_rounds(low, high)))

    def _sharpest(self, low: int, high: int) -> tuple[int, int]:
        """The adjacent measured counts inside a candidate with the largest change over the trend, when
        that change alone reaches `min_step`; else the candidate itself (a ramp of small changes is
        judged whole). Once the sharpest part is judged, the detector re-runs: the rest of the span is
        flagged again only if it holds more."""
        curve = self.curve()
        inside = [p.tokens for p in curve if low <= p.tokens <= high]
        if len(inside) <= 2:
            return low, high
        expected = expected_levels(curve)  # one trend fit for every interval inside
        size, a, b = max((abs(level_change(curve, a, b, expected)[0]), a, b)
                         for a, b in zip(inside, inside[1:], strict=False))
        return (a, b) if size >= self.settings.min_step else (low, high)

    def _next_counts(self, low: int, high: int) -> list[int]:
        """What a candidate needs measured next: the middle unmeasured grid count inside it, or, once
        there is none, the counts that are not yet settled."""
        inside = self._unmeasured_inside(low, high)
        return [inside[len(inside) // 2]] if inside else self._unsettled(low, high)

    def confirm(self, low: int, high: int, z: float) -> Confirmation:
        """Measure `low` and `high` alternately and judge the step between them (see the module doc).

        Up to three looks (`confirmation_looks`): after half the rounds, after all of them, and - only for
        a candidate still promising then (at least `min_step`, p below PROMISING) and while the budget
        allows - after twice as many; each look tests at its share of alpha, so together they keep the
        false-step rate at alpha. A clear step stops at the first look; a real step that its rounds leave
        just short of significance gets more rounds instead of a verdict that the next run may reverse.
        Each visit is taken with the drift at its time divided out (the profile of every visit so far):
        live, the two visits of a round are adjacent and the correction barely moves their ratio; in a
        replay, where they may come from different moments of the recording, it restores the pairing.
        """
        s = self.settings
        rounds = self.design_rounds(low, high)
        offset = self._trend_offset(low, high)
        effect, alpha = None, s.step_alpha
        looks = confirmation_looks(s.confirm_rounds)
        for i, (look, share) in enumerate(looks):
            if i == len(looks) - 1 and not self._earns_extra_look(effect, 2 * (look - len(rounds))):
                break
            alpha = share * s.step_alpha
            while len(rounds) < look:
                order = (high, low) if len(rounds) % 2 == 0 else (low, high)
                self.session.begin_pass(self._new_pass(), order)
                taken = {n: self._visit(n) for n in order}
                rounds.append((taken[low], taken[high]))
                self.rounds[(low, high)] = rounds
                self.paired.extend(taken.values())
            effect = self._paired(rounds, offset)
            if self._convincing(effect, alpha, rounds):
                return self._accepted(low, high, effect, len(rounds), z)
        change = effect.excess - 1.0
        if effect.p_value >= alpha:
            reason = f"not significant (p = {effect.p_value:.2g} >= {alpha:.2g}, {len(rounds)} rounds)"
        elif effect.pairs < MIN_ROUNDS:
            reason = f"too few rounds left after interference screening ({effect.pairs} < {MIN_ROUNDS})"
        elif abs(change) < s.min_step:
            reason = f"smaller than the minimum step ({100 * abs(change):.1f}% < {100 * s.min_step:.1f}%)"
        else:
            reason = f"carried by one of its {len(rounds)} rounds: without it the rest read less than the minimum step"
        return Confirmation(low, high, effect, False, "none", reason, z)

    def _earns_extra_look(self, effect: PairedEffect, cost: int) -> bool:
        """Still promising after the regular looks (at least `min_step`, p below PROMISING), and the budget
        can pay the `cost` visits of the extra rounds."""
        return (effect.p_value < PROMISING and abs(effect.excess - 1.0) >= self.settings.min_step
                and self._left() >= cost)

    def _convincing(self, effect: PairedEffect, alpha: float, rounds: list[tuple[Visit, Visit]]) -> bool:
        """Significant at `alpha`, at least `min_step`, carried by at least MIN_ROUNDS rounds that
        interference screening kept, and, while the rounds are too few for that screening to judge a
        round by their own spread, by no single round: without any one of them the rest still reach
        `min_step` in the same direction."""
        return (effect.p_value < alpha and abs(effect.excess - 1.0) >= self.settings.min_step
                and effect.pairs >= MIN_ROUNDS and not self._one_round_carries(effect, rounds))

    def _one_round_carries(self, effect: PairedEffect, rounds: list[tuple[Visit, Visit]]) -> bool:
        """Fewer rounds than interference screening needs to judge a round by their own spread, and
        without one of them the rest fall short of `min_step` or change direction (a replay once paired
        visits 6 s apart on an H100, one of them in a slow host state: three rounds read -2.4%, -3.6%
        and -12.3%, and p = 0.002)."""
        if len(rounds) >= SCREEN_MIN_PAIRS or len(rounds) < 2:
            return False
        d = self._log_ratios(rounds) - effect.offset
        others = (d.sum() - d) / (d.size - 1)  # the mean without each round in turn
        change = effect.excess - 1.0
        return not bool(np.all(np.sign(others) == np.sign(change))
                        and np.all(np.abs(np.expm1(others)) >= self.settings.min_step))

    @staticmethod
    def _accepted(low: int, high: int, effect: PairedEffect, rounds: int, z: float) -> Confirmation:
        change = effect.excess - 1.0
        kind = "drop" if change < 0 else "rise"
        reason = f"confirmed: {kind} of {100 * abs(change):.1f}% (p = {effect.p_value:.2g}, {rounds} rounds)"
        return Confirmation(low, high, effect, True, kind, reason, z)

    def _paired(self, rounds: list[tuple[Visit, Visit]], offset: float) -> PairedEffect:
        """The paired effect of high over low tokens, each visit corrected for the drift at its time, its
        t-test moderated by the noise of every other pair measured so far (`pomt.measurement.paired`). Borrowing
        that noise assumes every round's two visits were taken in one state of the machine (`_steady`);
        pairs whose rounds were not are tested on their own, and lend nothing."""
        own = {(a.tokens, b.tokens) for a, b in rounds}
        d = self._log_ratios(rounds)
        if not self._steady(rounds):
            return paired_effect(np.ones(d.size), np.exp(d), offset=offset)
        others = [self._log_ratios(r) for pair, r in self.rounds.items() if pair not in own and self._steady(r)]
        return paired_effect(np.ones(d.size), np.exp(d), offset=offset, prior=pooled_pair_noise(others))

    def _steady(self, rounds: list[tuple[Visit, Visit]]) -> bool:
        """Every round's two visits were taken in one state of the machine: the run's drift profile moved
        by less than STEADY_ROUND between them (live, visits back to back; a replay whose recording had
        them apart while the machine drifted fast fails)."""
        g = self._drift_log()
        return all(abs(g[id(a)] - g[id(b)]) < STEADY_ROUND for a, b in rounds)

    def _drift_log(self) -> dict[int, float]:
        """The log drift at every visit so far (by the visit's id), from `drift_profile`; cached per visit."""
        key = len(self.visits())
        if self._drift is None or self._drift[0] != key:
            everything = self.visits()
            _, drift_log = drift_profile(everything)
            self._drift = (key, {id(v): g for v, g in zip(everything, drift_log, strict=True)})
        return self._drift[1]

    def _log_ratios(self, rounds: list[tuple[Visit, Visit]]) -> np.ndarray:
        """log(low / high) of each round, each visit corrected for the drift at its time."""
        g = self._drift_log()
        return np.array([math.log(a.median_ms / b.median_ms) - g[id(a)] + g[id(b)] for a, b in rounds])

    def record(self, reference_visits: int = 1, *, chain: bool = False) -> list[Visit]:
        """Every grid count in `passes` shuffled passes, nothing judged: a dense trace (`pomt record`). The
        aligned edges' two counts back to back as in an adaptive search's coarse scan, or with `chain`
        every two neighbouring counts back to back in half the passes (`chained_units`)."""
        self._calibrate()
        if chain:
            for number in range(self.settings.passes):
                self.measure_units(chained_units(self.grid, number), 1, reference_visits)
        else:
            pairs = self._anchor_pairs()
            paired = {n for pair in pairs for n in pair}
            units = [*pairs, *((n,) for n in self.grid if n not in paired)]
            self.measure_units(units, self.settings.passes, reference_visits)
        self._bar.close()
        return self.visits()

    def run(self) -> SearchResult:
        """Measure (full or adaptive), then refine and confirm; see the module docstring."""
        s = self.settings
        confirmations: list[Confirmation] = []
        try:
            self._calibrate()
            if self.adaptive:
                self.measure_units(self.coarse, s.coarse_passes)
                self.judge_anchors()
            else:
                self.measure_passes(self.grid, s.passes)
            confirmations = self.examine()
        except (_BudgetSpent, TraceExhausted) as exc:
            why = "the visit budget is spent" if isinstance(exc, _BudgetSpent) else str(exc)
            confirmations = list(self.judged.values()) + [
                Confirmation(lo, hi, None, False, "none", f"not examined: {why}", z)
                for lo, hi, z in self.candidates() if (lo, hi) not in self.judged
            ]
        self._bar.close()
        points = self.curve()
        return SearchResult(
            points=points,
            steps=confirmed_steps(points, confirmations),
            candidates=confirmations,
            drift=drift(self.visits(), self.reference),
            noise=self.noise(),
            reps=self.reps,
            visits=self.session.visits,
            measured=self.session.measured,
            full_grid_visits=self.full_grid_visits,
            budget_visits=self.budget,
            budget_spent=any(c.reason.startswith("not examined") for c in confirmations),
            design=self.visits(),
        )


def chained_units(grid: list[int], number: int) -> list[tuple[int, ...]]:
    """The units of pass `number` (from 0) of a chained recording: the grid's counts as neighbouring pairs,
    from its first count in even passes and from its second in odd ones, so that every two neighbours are
    back to back in half the passes and a replay serves any adjacent pair as a search measures it live;
    ascending in passes 0, 1, 4, 5, ..., descending in 2, 3, 6, 7, ..., so each pair comes in both orders."""
    start = number % 2
    pairs = [(grid[i], grid[i + 1]) for i in range(start, len(grid) - 1, 2)]
    if (number // 2) % 2:
        pairs = [(b, a) for a, b in pairs]
    paired = {n for pair in pairs for n in pair}
    return [*pairs, *((n,) for n in grid if n not in paired)]


def confirmation_looks(confirm_rounds: int) -> list[tuple[int, float]]:
    """(rounds, share of alpha) of each look of a confirmation: half the rounds (at least three), all of
    them, and twice as many for a candidate still promising (LOOK_ALPHAS; the first two merge, shares
    added, when they coincide). The shares sum to 1: a Bonferroni split over the looks."""
    looks: dict[int, float] = {}
    for rounds, share in zip((max(3, confirm_rounds // 2), confirm_rounds, 2 * confirm_rounds), LOOK_ALPHAS,
                             strict=True):
        looks[rounds] = looks.get(rounds, 0.0) + share
    return sorted(looks.items())


def expected_levels(points: list[CurvePoint]) -> dict[int, float]:
    """The curve's smooth trend at each of its counts (`pomt.measurement.steps.trend`, noise from the points)."""
    t = np.array([p.tokens for p in points], dtype=float)
    smooth = trend(t, np.array([p.latency_ms for p in points]), float(np.median([p.se_ms for p in points])))
    return dict(zip([p.tokens for p in points], smooth.tolist(), strict=True))


def level_change(points: list[CurvePoint], low: int, high: int,
                 expected: dict[int, float] | None = None) -> tuple[float, float]:
    """The curve's level change from `high` to `low` tokens over the trend's (a fraction, negative for
    a drop) and its standard error; `expected`: the curve's `expected_levels`, when already known."""
    level = {p.tokens: p for p in points}
    expected = expected if expected is not None else expected_levels(points)
    change = (level[low].latency_ms / expected[low]) / (level[high].latency_ms / expected[high]) - 1.0
    se = math.hypot(level[low].se_ms / level[low].latency_ms, level[high].se_ms / level[high].latency_ms)
    return change, se


def confirmed_steps(points: list[CurvePoint], confirmations: list[Confirmation]) -> list[Step]:
    """A `Step` for every accepted confirmation, its levels from the pooled curve."""
    level = {p.tokens: p.latency_ms for p in points}
    return sorted(
        (paired_step(c.low, c.high, level[c.high], level[c.low], c.effect, c.candidate_z)
         for c in confirmations if c.accepted and c.effect is not None),
        key=lambda step: step.tokens,
    )


__all__ = [
    "LOOK_ALPHAS", "Confirmation", "LatencySearch", "SearchResult", "SearchSettings", "chained_units",
    "confirmation_looks",
    "confirmed_steps", "expected_levels", "level_change", "token_grid",
]
