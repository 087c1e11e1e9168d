"""Which token counts to measure and which latency steps are real: the search over a token grid.

A full search visits every grid count in shuffled passes. An adaptive one visits a coarse subset (the aligned
edges), judges the edges on those rounds, on a noisy machine spends power passes on the counts within reach whose
windows could miss a step of `--detect` %, then refines the candidate steps and confirms each by paired measurement,
and gives what is left of its budget to power passes again. Given its seed and what it measures the search is
deterministic, so a run resumed from its journal continues exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pomt.checks import check_options
from pomt.errors import GridError
from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement import confirmation as cand
from pomt.measurement.confirmation import MIN_STEP_SE, Candidate, Confirmation, Judge, confirmed_steps, rejected
from pomt.measurement.design import BudgetSpent, Measurer, anchor_pairs, checked_grid, coarse_units, design_rounds
from pomt.measurement.drift import (
    Drift,
    corrected_values,
    drift,
    pool_visits,
    reconcile_levels,
    relative_noise,
    visit_noise,
)
from pomt.measurement.sources import MeasurementRun, TraceExhausted
from pomt.measurement.steps import Step
from pomt.measurement.windows import (
    WindowScan,
    WindowShift,
    WindowTest,
    passes_first,
    power_passes,
    scan_visits,
    window_span,
    window_verdicts,
)
from pomt.options import ADVANCED, MEASUREMENT, option

LEAST_CANDIDATES = 3  # candidates the smallest adaptive budget can still examine
FOCUS = 3  # candidates an adaptive round works on at once, most significant first
BUDGET_SPENT = "the visit budget is spent"  # why candidates left when the budget ran out go unexamined


@dataclass(frozen=True)
class SearchSettings:
    """How a search measures and when it believes a step; each field is also the CLI option of its name."""

    passes: int = option(6, "Shuffled passes over every count of a full search, the reference (N) in each; the "
                            "adaptive search's budget is a fraction of that full grid.", min=2, panel=MEASUREMENT)
    coarse_passes: int = option(3, "Shuffled passes over the adaptive search's coarse counts.", min=2, panel=ADVANCED)
    refine_passes: int = option(1, "Passes over each round of counts an adaptive search adds.", min=1, panel=ADVANCED)
    reps: int | None = option(None, "Timed forwards per visit (default: about --visit-s of timing).", min=1,
                              panel=MEASUREMENT)
    visit_s: float = option(0.1, "Seconds of timing a visit aims at, when --reps is not given.", panel=ADVANCED)
    coarse_stride: int | None = option(None, "Adaptive search's coarse stride (default: sqrt of the grid).", min=1,
                                       panel=ADVANCED)
    candidate_k: float = option(3.0, "Detector threshold (noise units) for a candidate step.", panel=ADVANCED)
    step_alpha: float = option(0.01, "False-step rate of the paired confirmation (t-test level).", panel=ADVANCED)
    min_step: float = option(0.03, "Smallest step (fraction of latency, beyond the trend) that is reported: a "
                                   f"confirmed step's paired estimate less {MIN_STEP_SE:g} standard error reaches it.",
                             panel=MEASUREMENT)
    confirm_rounds: int = option(6, "Paired rounds (A B, B A, ...) that confirm a step.", min=3, panel=MEASUREMENT)
    budget: float = option(0.2, "Adaptive search's most visits, as a fraction of the full grid's.", panel=MEASUREMENT)
    detect: float = option(5.0, "Detection target in %: after the coarse scan, an adaptive search keeps visiting "
                                "the counts within reach whose window could miss a step of this size, as far as "
                                "the budget goes; the run states the limit it reached.", panel=MEASUREMENT)
    align: int = option(8, "Token alignment the hardware favours (SIMD width, GEMM or attention tile): the "
                           "adaptive search's coarse scan measures each multiple of it beside the count below, "
                           "as a pair, and tests each such edge for a step (0: a plain strided scan).", min=0,
                        panel=ADVANCED)

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
            (0.0 < self.detect < 100.0, f"--detect must lie in (0, 100) percent, got {self.detect}"),
            (self.candidate_k > 0, f"--candidate-k must be positive (noise units), got {self.candidate_k:g}"),
        ]
        for ok, message in problems:
            if not ok:
                raise GridError(message)
        return check_options(self)

    @property
    def verdict_cost(self) -> int:
        """Visits one candidate's verdict may take: its paired rounds and a few counts to settle."""
        return 2 * self.confirm_rounds + 6

    def least_budget(self, coarse: list[tuple[int, ...]]) -> int:
        """The least budget: the coarse scan plus room to carry LEAST_CANDIDATES candidates to a verdict."""
        scan = self.coarse_passes * (sum(len(unit) for unit in coarse) + 1)
        return scan + LEAST_CANDIDATES * self.verdict_cost


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
    detection: WindowScan | None = None  # the windows over the counts within reach, and their limits

    def steps_within(self, reach: tuple[int, int]) -> int:
        return sum(reach[0] <= s.tokens and s.upper_tokens <= reach[1] for s in self.steps)

    def detection_sentence(self) -> str | None:
        """The one line on what this run could have seen within reach (`WindowScan.sentence`)."""
        d = self.detection
        return None if d is None else d.sentence(self.steps_within(d.reach), spent=(self.visits, self.full_grid_visits))

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
                f"{self.drift.reference_tokens} tokens{self.drift.one_pass_words()}), more than the smallest effect "
                f"reported ({smallest:.1f}%): steps and gains rest on paired measurements, absolute latencies do not")


@dataclass(frozen=True)
class SearchScope:
    """What a search covers: the `grid` of token counts with the `reference` count N in it; `adaptive` or every count
    in full passes; and `focus_from`, the lowest count the caller's policy reaches (None: the whole grid)."""

    grid: list[int]
    reference: int
    adaptive: bool = True
    focus_from: int | None = None


class LatencySearch:
    """One search over a token grid through a `MeasurementRun`; `run()` measures, refines and confirms."""

    def __init__(self, measuring: MeasurementRun, scope: SearchScope, settings: SearchSettings, *, seed: int = 0,
                 progress: bool = True):
        adaptive, reference, focus_from = scope.adaptive, scope.reference, scope.focus_from
        self.grid, self.reference = checked_grid(scope.grid, reference), reference
        self.settings = s = settings.check()
        self.adaptive, self.focus_from = adaptive, focus_from
        self.full_grid_visits = s.passes * len(self.grid)
        aligned = anchor_pairs(self.grid, reference, s.align) if adaptive else []
        self.anchors = [pair for pair in aligned if focus_from is None or pair[0] >= focus_from]
        self.coarse = coarse_units(self.grid, self.anchors, s.coarse_stride,
                                   sparse_below=len(self.anchors) < len(aligned))
        self.budget = max(int(s.budget * self.full_grid_visits), s.least_budget(self.coarse)) if adaptive else None
        self.pending: dict[tuple[int, int], Candidate] = {}  # anchor pairs the coarse rounds left open
        self.measurer = Measurer(measuring, reference, seed=seed, budget=self.budget,
                                 total=self.budget or self.full_grid_visits, progress=progress)
        self.judge = Judge(self.measurer, alpha=s.step_alpha, min_step=s.min_step, confirm_rounds=s.confirm_rounds)
        self._curve: tuple[tuple[int, int, int], list[CurvePoint]] | None = None
        self.shifts: tuple[WindowShift, ...] = ()  # what the windows within reach show
        self.power_stop = ""  # why the last power passes stopped short of the target (`WindowScan.stopped`)
        self.reach = (focus_from if focus_from is not None else self.grid[0]), self.grid[-1]
        self.windowed = window_span(self.grid, self.reach)  # the counts the windows over the reach take in

    def curve(self) -> list[CurvePoint]:
        """The pooled, drift-corrected curve of every visit so far, reconciled with the paired rounds of every pair
        tested (a judged pair with the effect its verdict rests on). Cached per visit, pair and verdict."""
        visits, rounds, judged = self.measurer.visits(), self.judge.rounds, self.judge.judged
        key = (len(visits), len(rounds), len(judged))
        if self._curve is None or self._curve[0] != key:
            pairs = []
            for (low, high), taken in rounds.items():
                verdict = judged.get((low, high))
                effect = verdict.effect if verdict and verdict.effect else self.judge.effect(taken, 0.0)
                pairs.append((low, high, math.log(effect.ratio), effect.standard_error))
            self._curve = (key, reconcile_levels(pool_visits(visits, self.reference), pairs, self.reference))
        return self._curve[1]

    def candidates(self) -> list[Candidate]:
        """The aligned edges left open, the detector's and the windows' candidates, in the order they are examined."""
        found = cand.detected(self.curve(), self.settings.candidate_k, self._accepted_steps())
        windows = [Candidate(w.low, w.high, abs(w.z)) for w in self.shifts]
        return cand.ranked([*self.pending.values(), *found, *windows], self.pending, self.focus_from or 0)

    def _accepted_steps(self) -> list[Confirmation]:
        return [c for c in self.judge.judged.values() if c.accepted and c.effect is not None]

    def _trend_offset(self, low: int, high: int) -> float:
        """log(trend at low / trend at high): the change the smooth trend alone predicts across a step."""
        expected = cand.expected_levels(self.curve())
        return math.log(expected[low] / expected[high]) if expected[low] > 0 < expected[high] else 0.0

    def judge_anchors(self) -> None:
        """Judge each anchor pair on the paired rounds the coarse passes hold; those left open stay `pending`."""
        for pair in self.anchors:
            rounds = design_rounds(self.measurer.design, *pair)
            if len(rounds) >= 3:
                self.judge.rounds[pair] = rounds
        for low, high in list(self.judge.rounds):
            z = self.judge.screen(low, high, self._trend_offset(low, high), self.settings.candidate_k)
            if z is not None:
                self.pending[(low, high)] = Candidate(low, high, z)

    def confirm(self, low: int, high: int, z: float) -> Confirmation:
        """The paired verdict on the step between `low` and `high` (`Judge.confirm`), beyond the trend."""
        return self.judge.confirm(low, high, z, self._trend_offset(low, high))

    def examine(self) -> list[Confirmation]:
        """Refine and confirm candidates in the order of `candidates`, as far as the budget goes: the first ready one
        of the FOCUS first is judged; when none is ready, one pass measures what they need next."""
        judged = self.judge.judged
        while todo := [c for c in self.candidates() if c.span not in judged]:
            ready = [c for c in todo[:FOCUS] if not cand.next_counts(self.grid, self.measurer.visits(), *c.span)]
            if ready:
                if not self._judge(ready[0]):
                    break
                continue
            batch = self._refinement(todo[:FOCUS])
            if not batch:
                break
            try:
                self.measurer.measure_passes(batch, 1)
            except TraceExhausted as exc:  # a replay: the candidates that wanted these counts go unexamined
                for c in todo[:FOCUS]:
                    if set(cand.next_counts(self.grid, self.measurer.visits(), *c.span)) & set(batch):
                        judged[c.span] = rejected(c.low, c.high, f"not examined: {exc}", c.z)
        unjudged = [c for c in self.candidates() if c.span not in judged]
        skipped = [rejected(c.low, c.high, f"not examined: {BUDGET_SPENT}", c.z) for c in unjudged]
        return list(judged.values()) + skipped

    def _judge(self, candidate: Candidate) -> bool:
        """Judge a ready candidate at its sharpest part (rejected at once when the curve's own estimate is clearly
        below `min_step`). False when the budget cannot pay its rounds."""
        judged, min_step = self.judge.judged, self.settings.min_step
        low, high = candidate.span
        sharpest = cand.sharpest(self.curve(), low, high, min_step)
        if sharpest not in judged:  # a step the detector spread over its neighbours: its sharpest part
            low, high = sharpest
        change, se = cand.level_change(self.curve(), low, high)
        if abs(change) + 2.0 * se < min_step:
            reason = (f"smaller than the minimum step by the design's estimate ({100 * abs(change):.1f}% +- "
                      f"{200 * se:.1f}% < {100 * min_step:.1f}%)")
            judged[(low, high)] = rejected(low, high, reason, candidate.z)
            return True
        if self.measurer.left() < self._rounds_cost(low, high):
            return False
        try:
            judged[(low, high)] = self.confirm(low, high, candidate.z)
        except TraceExhausted as exc:
            judged[(low, high)] = rejected(low, high, f"not examined: {exc}", candidate.z)
        return True

    def _rounds_cost(self, low: int, high: int) -> int:
        """Visits a candidate's paired rounds take to reach its regular verdict, less the rounds the design holds."""
        return 2 * max(0, self.settings.confirm_rounds - len(design_rounds(self.measurer.design, low, high)))

    def _refinement(self, focus: list[Candidate]) -> list[int]:
        """The counts one refinement pass measures for the `focus` candidates, each as long as the budget left can
        carry it to its verdict."""
        batch: set[int] = set()
        cost = 1  # the reference
        for c in focus:
            wanted = set(cand.next_counts(self.grid, self.measurer.visits(), *c.span)) - batch
            inside = cand.unmeasured_inside(self.grid, self.measurer.visits(), *c.span)
            levels = math.ceil(math.log2(len(inside) + 1)) if inside else 0
            need = len(wanted) + levels + 3 + 2 * self.settings.confirm_rounds  # what is left to reach its verdict
            if cost + need > self.measurer.left():
                break
            batch |= wanted
            cost += len(wanted)
        return sorted(batch)

    def detection(self) -> WindowScan:
        """The windows over the counts within reach on every visit so far (`pomt.measurement.windows`)."""
        return scan_visits(self.measurer.visits(), self.curve(), self._accepted_steps(), self.reach,
                           WindowTest(self.settings.step_alpha, self.settings.min_step), below=self.windowed[0])

    def strengthen(self, reserve: int) -> WindowScan:
        """Power passes leaving `reserve` visits; then the windows' shifts become candidates."""
        found = power_passes(self.measurer, self.grid, self.windowed, self.settings.detect, reserve, self.detection)
        self.shifts, self.power_stop = found.shifts, found.stopped
        return found

    def run(self) -> SearchResult:
        """Measure (full or adaptive), then refine and confirm (see the module docstring)."""
        s, m = self.settings, self.measurer
        confirmations: list[Confirmation] = []
        try:
            m.calibrate(s.reps, s.visit_s)
            if self.adaptive:
                m.measure_units(self.coarse, s.coarse_passes)
                self.judge_anchors()
                if passes_first(self.grid, self.windowed, m.left(), visit_noise(corrected_values(m.visits()))):
                    self.strengthen(max(LEAST_CANDIDATES * s.verdict_cost, int(m.left()) // 2))
            else:
                m.measure_passes(self.grid, s.passes)
            confirmations = self.examine()
            if self.adaptive:
                self.strengthen(s.verdict_cost)
                confirmations = self.examine()
                upgraded = {(c.low, c.high): c for c in window_verdicts(self.shifts, self.judge.judged, s.min_step)}
                self.judge.judged.update(upgraded)
                confirmations = [upgraded.get((c.low, c.high), c) for c in confirmations]
        except (BudgetSpent, TraceExhausted) as exc:
            why = BUDGET_SPENT if isinstance(exc, BudgetSpent) else str(exc)
            unjudged = [c for c in self.candidates() if c.span not in self.judge.judged]
            confirmations = [*self.judge.judged.values(), *(rejected(c.low, c.high, f"not examined: {why}", c.z)
                                                            for c in unjudged)]
        m.close()
        points = self.curve()
        return SearchResult(
            points=points, steps=confirmed_steps(points, confirmations), candidates=confirmations,
            drift=drift(m.visits(), self.reference), noise=relative_noise(corrected_values(m.visits())),
            reps=m.reps, visits=m.measuring.visits, measured=m.measuring.measured,
            full_grid_visits=self.full_grid_visits, budget_visits=self.budget,
            budget_spent=any(c.reason.startswith("not examined") for c in confirmations), design=m.visits(),
            detection=self.detection().short_of(s.detect, self.power_stop),
        )


__all__ = ["LatencySearch", "SearchResult", "SearchScope", "SearchSettings"]
